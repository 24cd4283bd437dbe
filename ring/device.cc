#include "ring/device.h"

#include <string>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace ringserve {

std::string_view ChannelKindName(ChannelKind kind) {
  switch (kind) {
    case ChannelKind::kTcp:
      return "tcp";
    case ChannelKind::kCudaIpc:
      return "cuda_ipc";
    case ChannelKind::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::optional<ChannelKind> ParseChannelKind(std::string_view name) {
  if (name == "tcp") return ChannelKind::kTcp;
  if (name == "cuda_ipc") return ChannelKind::kCudaIpc;
  if (name == "nccl") return ChannelKind::kNccl;
  return std::nullopt;
}

std::string Device::ToString() const {
  return kind == Kind::kCpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  std::string trimmed(begin == std::string_view::npos ? std::string_view()
                                                      : text.substr(begin, end - begin + 1));
  if (trimmed == "cpu") return Device{};
  if (trimmed == "cuda") return Device{.kind = Device::Kind::kCuda, .index = 0};
  if (trimmed.rfind("cuda:", 0) == 0) {
    std::string digits = trimmed.substr(5);
    bool all_digits = !digits.empty() && digits.size() <= 4 &&
                      digits.find_first_not_of("0123456789") == std::string::npos;
    if (all_digits) return Device{.kind = Device::Kind::kCuda, .index = std::stoi(digits)};
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown device '{}' (cpu, cuda or cuda:N)", std::string(text)));
}

}  // namespace ringserve
