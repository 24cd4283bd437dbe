// The ring's deployment description: which model, which activation channel, where the client
// APIs listen, scheduler knobs, and the stages (host, control port, device, layer slice).
// Parsed from a hosts.yaml once, validated against the model's layer count, and then immutable.
//
// hosts.yaml (every key but `model` and `stages` is optional):
//
//   model: /models/llama-3.1-8b          # Hugging Face directory (kept as written)
//   channel: tcp                         # tcp (default) | cuda_ipc | nccl
//   api:
//     grpc: 0.0.0.0:50051                # default 127.0.0.1:50051
//     http: 0.0.0.0:8000                 # default: off
//   scheduler:
//     max_tokens_per_micro_batch: 512    # prefill chunk + decodes per micro-batch
//     micro_batches_in_flight: 4         # M; default 0 = stages that can run at once (GPUs)
//     kv_block_size: 16                  # positions per KV block
//     kv_blocks: 2048                    # blocks per stage pool, or instead:
//     kv_budget: 8GiB                    # bytes of KV per stage (B, KB/KiB, MB/MiB, GB/GiB)
//   partition: 14,14,12                  # or "5x8" (5 layers x 8 stages) or [14, 14, 12]
//   stages:
//     - host: 10.0.0.1
//       port: 7001                       # the stage's control port (`stage --listen`)
//       device: cuda:0                   # cpu | cuda:N
//       layers: 14                       # a count (follows the previous stage), or
//     - {host: 10.0.0.2, port: 7001, device: cuda:0, layers: [14, 28]}   # range [a, b), or
//     - {host: 10.0.0.3, port: 7001, device: cuda:0, layers: "28-40"}    # "a-b" = [a, b) too
//       kv_cache_dtype: fp8_e4m3         # auto (default: the model's type) | fp8_e4m3
//
// `partition` and per-stage `layers` are exclusive. Without either, the layers are split evenly
// (earlier stages take the remainder). Every layer must belong to exactly one stage, in order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/defaults.h"
#include "ring/device.h"
#include "ring/kv_cache_dtype.h"

namespace ringserve {

struct StageConfig {
  std::string host;      // name or address, as written ("localhost" is treated as 127.0.0.1)
  int control_port = 0;  // 1..65535
  Device device;
  int first_layer = 0;  // decoder layers [first_layer, last_layer)
  int last_layer = 0;
  // The element type of the stage's KV cache (ring/kv_cache_dtype.h); the coordinator's
  // --kv_cache_dtype sets it for every stage.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;

  int num_layers() const { return last_layer - first_layer; }
  // "host:port" of the control API.
  std::string endpoint() const;
};

struct SchedulerKnobs {
  int max_tokens_per_micro_batch = kDefaultMaxTokensPerMicroBatch;  // >= 1
  int micro_batches_in_flight = 0;          // 0 = stages that can run at once; otherwise >= 1
  int kv_block_size = kDefaultKvBlockSize;  // >= 1
  // Exactly one of these decides the per-stage KV pool; both 0 = the engine's default.
  int kv_blocks = 0;            // blocks per stage
  int64_t kv_budget_bytes = 0;  // bytes per stage; the engine converts with the model's shape
};

struct RingConfig {
  std::string model_dir;
  ChannelKind channel = ChannelKind::kTcp;
  std::string grpc_listen = kDefaultGrpcListen;  // "host:port"
  std::string http_listen;                       // "host:port"; empty = no HTTP API
  // `ring_secret`: the file holding the ring secret the stages were started with
  // (stage --ring-secret; common/ring_secret.h); empty = stages without one (loopback only).
  std::string ring_secret_file;
  SchedulerKnobs scheduler;
  std::vector<StageConfig> stages;  // in ring order; layers cover [0, num_layers) exactly once
  int num_layers = 0;               // the model's decoder layer count it was validated against
  std::string source;               // the file it came from, or "<embedded default>"

  int num_stages() const { return static_cast<int>(stages.size()); }
  // Stages that can compute at the same time: one per GPU (stages sharing a GPU take turns on
  // it), every CPU stage counted on its own.
  int num_parallel_stages() const;
  // micro_batches_in_flight, or num_parallel_stages() when that is 0: on a ring of distinct
  // GPUs as many micro-batches as stages keep every stage busy (decodes spread over them); on
  // stages sharing a GPU, more micro-batches would only make them contend for it, and each
  // decode micro-batch reads the weights once more.
  int effective_micro_batches_in_flight() const;
};

// Given the model directory named in the file, returns the model's decoder layer count (the
// coordinator reads config.json; tests return a constant). Its error is passed through.
using LayerCountFn = std::function<absl::StatusOr<int>(const std::string& model_dir)>;

// Parses and validates hosts.yaml text. `source` names the file in messages. Every error is
// InvalidArgument and names the source, the field (e.g. "stages[2].layers") and what is wrong:
// malformed YAML (with line), unknown keys, wrong types, missing model/stages, bad ports,
// unknown device or channel, duplicate endpoints, layers overlapping, missing or summing to the
// wrong count, partition not matching the stage count, and channel/device mismatches (tcp:
// any devices; cuda_ipc: cuda devices, all stages on one host; nccl: cuda devices, one GPU per
// stage, i.e. no two stages on the same host and ordinal). No exceptions escape.
absl::StatusOr<RingConfig> ParseRingConfig(std::string_view yaml_text, const std::string& source,
                                           const LayerCountFn& layer_count);
// Same, for a model whose layer count is already known.
absl::StatusOr<RingConfig> ParseRingConfig(std::string_view yaml_text, const std::string& source,
                                           int num_layers);

// Reads the file at `path` (common/bounded_file.h: a regular file of at most
// kMaxHostsFileBytes) and parses it as above. NotFound if it does not exist; InvalidArgument
// naming the path when it is not a regular file or is too large.
absl::StatusOr<RingConfig> LoadRingConfig(const std::string& path, const LayerCountFn& layer_count);

// Checks an already built RingConfig (what ParseRingConfig checks after parsing); for configs
// built in code, e.g. with flag overrides applied. InvalidArgument naming the field.
absl::Status ValidateRingConfig(const RingConfig& config);

// Per-stage layer counts for `num_layers` split over `num_stages` as evenly as possible; the
// first (num_layers % num_stages) stages take one more. InvalidArgument unless
// 1 <= num_stages <= num_layers.
absl::StatusOr<std::vector<int>> EvenPartition(int num_layers, int num_stages);

// Parses a partition spelling: "14,14,12" (counts) or "LxN" (N stages of L layers each, as in
// the field's "5x8" for 8 stages of 5 layers).
// InvalidArgument for anything else (empty, zero or negative counts, junk).
absl::StatusOr<std::vector<int>> ParsePartition(std::string_view text);

// Binds 127.0.0.1:0, reads the port the kernel chose and closes the socket. The port is free
// at return (another process may take it later; callers bind it soon after).
absl::StatusOr<int> PickFreeLocalPort();

struct DefaultRingOptions {
  std::string model_dir;
  int num_layers = 0;          // the model's decoder layer count
  int num_stages = 2;          // clamped to [1, num_layers]; ignored when `partition` is given
  std::vector<int> partition;  // layer counts per stage (ParsePartition); empty = even split
  Device device;               // every stage's device (several stages may share one GPU)
  ChannelKind channel = ChannelKind::kTcp;
  int max_tokens_per_micro_batch = 0;  // 0 = the SchedulerKnobs default
  int micro_batches_in_flight = 0;     // 0 = the SchedulerKnobs default (parallel stages)
  std::string grpc_listen = kDefaultGrpcListen;
  std::string http_listen;                            // empty = no HTTP API
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // every stage's
};

// The embedded default used when no hosts file is given: stages on 127.0.0.1, each on a
// distinct free control port (PickFreeLocalPort), all on `device`, with `channel`, the given
// partition or an even one, and default scheduler knobs. InvalidArgument (naming the field)
// when the partition does not sum to the model's layers or the channel does not suit the
// device. The result passes ValidateRingConfig.
absl::StatusOr<RingConfig> DefaultRingConfig(const DefaultRingOptions& options);

}  // namespace ringserve
