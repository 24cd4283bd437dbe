// Where a stage computes (Device) and how activations travel between stages (ChannelKind):
// parsed once from hosts.yaml, the coordinator's flags or the stage's Configure request.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringserve {

enum class ChannelKind { kTcp, kCudaIpc, kNccl };

// "tcp", "cuda_ipc", "nccl".
std::string_view ChannelKindName(ChannelKind kind);
// Parses the spelling above; nullopt for anything else.
std::optional<ChannelKind> ParseChannelKind(std::string_view name);

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // CUDA ordinal on its host; 0 for the CPU

  bool is_cuda() const { return kind == Kind::kCuda; }
  // "cpu" or "cuda:N".
  std::string ToString() const;
  bool operator==(const Device&) const = default;
};

// Parses "cpu", "cuda" (= cuda:0) or "cuda:N" (N >= 0). InvalidArgument otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view text);

}  // namespace ringserve
