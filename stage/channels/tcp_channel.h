// The `tcp` activation channel: a plain TCP connection per hop (stage i -> stage i + 1), with a
// framed, checked message per micro-batch:
//
//   header (32 bytes, little endian): magic "RSAC" u32 | version u16 | reserved u16 |
//       micro_batch_id u64 | payload_bytes u64 | payload_crc32 u32 | header_crc32 u32
//   payload: payload_bytes bytes
//
// The connection starts with a hello (magic "RSHI" u32, sender stage index i32) so a receiver
// refuses a connection from the wrong stage. With a ring secret (common/ring_secret.h) both
// sides then prove they know it, before any frame (the GPU channels' memory handles included)
// is exchanged:
//   connector -> listener: nonce_c (32 hex chars)
//   listener -> connector: nonce_l (32) | Mac(ChannelProofMessage("listener", nonce_c, i)) (64)
//   connector -> listener: Mac(ChannelProofMessage("connector", nonce_l, i)) (64)
// A peer that fails this (or takes longer than 5 s) is dropped and the listener keeps waiting.
// The listener checks connections side by side (TcpListener::AcceptLink), so a silent one
// delays no other.
// CRC32 is zlib's (IEEE).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ring_secret.h"
#include "stage/channels/activation_channel.h"

namespace ringserve {

// CRC-32 (IEEE, as zlib's crc32) of `data`.
uint32_t Crc32(std::span<const std::byte> data);

// Splits "host:port" (port 0..65535). InvalidArgument naming `what` otherwise.
absl::Status SplitHostPort(const std::string& endpoint, const std::string& what, std::string* host,
                           int* port);

// A connected socket carrying checked frames (the framing above; `tag` is the micro_batch_id
// field) in both directions. The tcp channel sends activations over one; the GPU channels
// (stage/channels/device_channel.h) carry their small control messages over one per hop.
// Not thread-safe: one reader and one writer, which may be the same thread; Abort and
// bytes_moved may be called from any thread.
class TcpLink {
 public:
  TcpLink(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~TcpLink() { Close(); }
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  // Writes one frame. `what` prefixes error messages. On error the link is closed.
  absl::Status Write(uint64_t tag, std::span<const std::byte> payload, absl::Time deadline,
                     const std::string& what);
  // Reads one frame, which must carry `expected_tag` and exactly out.size() payload bytes
  // (DataLoss otherwise, naming both). On error the link is closed.
  absl::Status Read(uint64_t expected_tag, std::span<std::byte> out, absl::Time deadline,
                    const std::string& what);
  // Shuts the socket down: the peer's pending and later reads fail.
  void Close();
  // Thread-safe: a Read or Write blocked in another thread (and every later one) fails at once
  // with Cancelled ("aborted"), the peer's too; the owner still calls Close.
  void Abort();
  bool closed() const { return fd_ < 0; }
  // "stage N (host:port)".
  const std::string& peer() const { return peer_; }
  // Thread-safe: bytes written and read so far, frame headers and partial frames included.
  int64_t bytes_moved() const { return bytes_moved_.load(std::memory_order_relaxed); }

 private:
  std::mutex fd_mu_;  // Close and Abort: Abort never shuts down a descriptor reused after Close
  int fd_;
  std::string peer_;
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> bytes_moved_{0};
};

// A bound, listening socket that accepts the previous stage's connection.
// Thread-compatible; Accept may be called once per expected peer.
//
// Each accepted connection introduces itself (hello, then with a secret the proof) on a thread
// of its own, with at most 5 s, so a stranger that connects and stays silent holds no other
// connection's handshake. At most 16 introduce themselves at once; one more drops the oldest
// pending (stage/channels/pending_handshakes.h).
class TcpListener {
 public:
  // Binds `host`:`port` (port 0 = the kernel picks one). Unavailable naming the address when
  // binding fails.
  // With `secret`, only peers that prove knowledge of it are accepted (copied).
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host, int port,
                                                             const RingSecret* secret = nullptr);
  ~TcpListener();

  // "host:port" actually bound (the chosen port when 0 was asked).
  const std::string& endpoint() const { return endpoint_; }

  // Waits up to `timeout` for a connection whose hello names `expected_sender_index` (and,
  // with a secret, that proves it). Connections with a wrong hello or proof are closed and
  // waiting continues; those still introducing themselves when one is admitted, or at the
  // deadline, are closed too. DeadlineExceeded naming the endpoint when nobody came.
  absl::StatusOr<std::unique_ptr<ActivationReceiver>> Accept(int expected_sender_index,
                                                             absl::Duration timeout);
  // As Accept, but returns the bare link (for the GPU channels' control messages).
  absl::StatusOr<std::unique_ptr<TcpLink>> AcceptLink(int expected_sender_index,
                                                      absl::Duration timeout);

 private:
  TcpListener(int fd, std::string endpoint, std::optional<RingSecret> secret)
      : fd_(fd), endpoint_(std::move(endpoint)), secret_(std::move(secret)) {}
  int fd_;
  std::string endpoint_;
  std::optional<RingSecret> secret_;
};

// Connects to `endpoint` ("host:port"), retrying refused connections until `timeout` (the peer
// may still be starting), and sends the hello with `sender_index`. With `secret`, both sides
// then authenticate (above); PermissionDenied when the listener's proof is wrong.
absl::StatusOr<std::unique_ptr<ActivationSender>> TcpConnect(const std::string& endpoint,
                                                             int sender_index,
                                                             absl::Duration timeout,
                                                             const RingSecret* secret = nullptr);
// As TcpConnect, but returns the bare link (for the GPU channels' control messages).
absl::StatusOr<std::unique_ptr<TcpLink>> TcpConnectLink(const std::string& endpoint,
                                                        int sender_index, absl::Duration timeout,
                                                        const RingSecret* secret = nullptr);

}  // namespace ringserve
