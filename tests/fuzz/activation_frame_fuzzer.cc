// Fuzzes the activation frame reader (stage/tcp_channel.h): the input arrives on a socket as a
// peer would send it (header, payload, maybe several frames) and TcpLink::Read checks it.
// The first two bytes choose the expected payload size (so sizes other than the seed's are
// tried too).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/time/time.h"
#include "stage/channels/tcp_channel.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t expected = (static_cast<size_t>(data[0]) << 8 | data[1]) % 4096;
  data += 2;
  size -= 2;
  if (size > 1 << 16) return 0;  // stays within the socket buffer: the write never blocks
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  int buffer = 1 << 18;
  setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  if (size > 0 && write(fds[1], data, size) != static_cast<ssize_t>(size)) {
    close(fds[0]);
    close(fds[1]);
    return 0;
  }
  close(fds[1]);  // end of stream after the input
  ringserve::TcpLink link(fds[0], "fuzz peer");
  std::vector<std::byte> payload(expected);
  for (uint64_t tag = 7; tag < 10 && !link.closed(); ++tag) {
    if (!link.Read(tag, payload, absl::Now() + absl::Seconds(1), "fuzz").ok()) break;
  }
  return 0;
}
