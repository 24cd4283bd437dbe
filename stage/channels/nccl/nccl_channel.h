// The `nccl` activation channel: stage/channels/device_channel.h over NCCL point-to-point, one GPU
// per stage, same host or across hosts. Each hop (stage i -> stage i + 1) is a 2-rank communicator
// (sender rank 0, receiver rank 1) plus a TcpLink (stage/channels/tcp_channel.h) that carries the
// NCCL unique id at set-up and one small frame per message:
//
//   frame: tag = micro_batch_id, payload = u64 byte count (little endian)
//   then:  ncclSend / ncclRecv of that many bytes (ncclUint8) on the hop's own stream
//
// The receiver reads and checks the frame (DataLoss for a wrong id or byte count, naming both)
// BEFORE posting ncclRecv, so a mismatch never leaves NCCL waiting. Communicators are
// non-blocking (ncclConfig_t::blocking = 0); every wait polls with a deadline and, on timeout
// or error, aborts the communicator (ncclCommAbort), so nothing hangs.
//
// Transfers run on a stream of the hop's own, ordered against the caller's compute stream by
// events, and neither CPU waits for them: Send copies the activations into one of two staging
// buffers on the compute stream (device-local) and posts ncclSend of the staging buffer on the
// hop stream, so the transfer overlaps the sender's next forward pass; Recv posts ncclRecv into
// the destination on the hop stream after the compute stream's earlier work, and the compute
// stream waits for it. A transfer's completion is checked (polled, with the deadline) two
// transfers later, before its staging buffer or event is reused: an error or a stalled peer
// surfaces there, or at the receiver's deadline.
//
// bytes_sent() / bytes_received() count activation bytes only (not the frames). A receiver
// blocked on the frame sees the sender's Close() at once (Unavailable). A transfer whose peer
// dies after the frame leaves the receiver's compute stream waiting for it until the receiver
// checks it (two receives later, DeadlineExceeded at that call's deadline) or closes the
// channel: either aborts the communicator, which ends the transfer.
//
// Set-up ends with a 1-byte warm-up transfer (sender -> receiver), so the NCCL connection
// exists and works when NcclAccept / NcclConnect return.
//
// Both ends are bound to one CUDA device; every call (set-up, Send, Recv, Close) makes that
// device current on the calling thread and leaves it so.
//
// Run time: needs libnccl.so.2 (the library links by soname). For stages on different hosts,
// NCCL picks its bootstrap interface itself; set NCCL_SOCKET_IFNAME when it picks wrong.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage/channels/device_channel.h"
#include "stage/channels/tcp_channel.h"

namespace ringserve {

// Receiving side of hop (sender_index -> sender_index + 1): takes an established link (from
// TcpListener::AcceptLink), creates the NCCL unique id, sends it to the sender over the link,
// and joins a 2-rank communicator as rank 1 on CUDA `device`. Must run concurrently with the
// peer's NcclConnect (another thread or process). DeadlineExceeded when the sender does not
// join within `timeout`; Unavailable for CUDA/NCCL errors. Blocks the calling thread.
absl::StatusOr<std::unique_ptr<DeviceActivationReceiver>> NcclAccept(std::unique_ptr<TcpLink> link,
                                                                     int device,
                                                                     absl::Duration timeout);

// Sending side: link from TcpConnectLink; reads the unique id, joins as rank 0 on `device`.
// FailedPrecondition when the two ends run different NCCL versions.
absl::StatusOr<std::unique_ptr<DeviceActivationSender>> NcclConnect(std::unique_ptr<TcpLink> link,
                                                                    int device,
                                                                    absl::Duration timeout);

// Whether this build has NCCL: always true in this library (targets that link
// rs_nccl_channel also get the compile definition RINGSERVE_HAVE_NCCL=1).
bool NcclAvailable();

// The NCCL version loaded at run time, e.g. "2.28.3" (for logs and error messages).
std::string NcclVersionString();

}  // namespace ringserve
