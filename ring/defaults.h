// Defaults that both processes, the hosts file and the tools share: one place for each number.
#pragma once

namespace ringserve {

// Positions per KV block (scheduler, stages, hosts.yaml `scheduler.kv_block_size`).
inline constexpr int kDefaultKvBlockSize = 16;
// Prefill chunk plus decodes per micro-batch (hosts.yaml `scheduler.max_tokens_per_micro_batch`).
inline constexpr int kDefaultMaxTokensPerMicroBatch = 512;
// Share of a GPU's memory the CUDA stages on it may take together (split evenly between them).
inline constexpr double kDefaultGpuMemoryFraction = 0.9;
// KV blocks of a CPU stage's pool when the ring fixes neither kv_blocks nor kv_budget.
inline constexpr int kDefaultCpuKvBlocks = 512;
// The coordinator's gRPC API address.
inline constexpr const char* kDefaultGrpcListen = "127.0.0.1:50051";
// Seconds to wait for a stage's control endpoint to accept a connection.
inline constexpr double kDefaultConnectTimeoutSeconds = 10;
// Seconds a request waits for a failed ring to be formed again before it fails (Unavailable).
inline constexpr double kDefaultRingDownTimeoutSeconds = 120;
// Seconds a stage waits for its neighbour's activations during a step.
inline constexpr double kDefaultStepTimeoutSeconds = 120;
// Seconds a ring with work may make no progress (no stage finishes a step, computes or moves
// activation bytes) before the coordinator fails it (coordinator/grpc_ring_link.h).
inline constexpr double kDefaultStallTimeoutSeconds = 10;

}  // namespace ringserve
