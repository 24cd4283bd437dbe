#include "coordinator/ring_bringup.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/status_macros.h"
#include "coordinator/grpc_ring_link.h"
#include "coordinator/stage_client.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

// Runs fn(0..n-1) on n threads and returns the first error in stage order.
absl::Status ForEachStage(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { statuses[i] = fn(i); });
  for (auto& t : threads) t.join();
  for (const auto& s : statuses) RS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> RequestedKvBlocks(const RingConfig& ring, const ModelConfig& model,
                                                   int default_kv_blocks) {
  const int block_size = ring.scheduler.kv_block_size;
  std::vector<int> blocks(ring.num_stages());
  for (int i = 0; i < ring.num_stages(); ++i) {
    const StageConfig& stage = ring.stages[i];
    int n = stage.device.is_cuda() ? 0 : default_kv_blocks;
    if (ring.scheduler.kv_blocks > 0) n = ring.scheduler.kv_blocks;
    if (ring.scheduler.kv_budget_bytes > 0) {
      const int64_t element_bytes =
          KvCacheElementBytes(stage.kv_cache_dtype, stage.device.is_cuda() ? 2 : 4);
      const int64_t block_bytes = static_cast<int64_t>(block_size) *
                                  model.kv_values_per_token_layer() * element_bytes *
                                  stage.num_layers();
      n = static_cast<int>(std::min<int64_t>(
          ring.scheduler.kv_budget_bytes / std::max<int64_t>(block_bytes, 1), 1 << 24));
      if (n < 1) {
        return absl::InvalidArgumentError(
            fmt::format("{}: scheduler.kv_budget: {} bytes hold no {}-byte KV block of stage {}",
                        ring.source, ring.scheduler.kv_budget_bytes, block_bytes, i));
      }
    }
    blocks[i] = n;
  }
  return blocks;
}

absl::StatusOr<FormedRing> FormGrpcRing(const BringUpOptions& options, const ModelConfig& model) {
  const RingConfig& ring = options.ring;
  const int num_stages = ring.num_stages();
  const int block_size = ring.scheduler.kv_block_size;
  std::mutex progress_mu;
  auto progress = [&](StageProgress p) {
    if (!options.on_progress) return;
    std::lock_guard<std::mutex> lock(progress_mu);
    options.on_progress(p);
  };
  RS_ASSIGN_OR_RETURN(std::vector<int> kv_blocks,
                      RequestedKvBlocks(ring, model, options.default_kv_blocks));
  // Stages sharing one GPU split its memory.
  std::map<std::pair<std::string, int>, int> stages_per_gpu;
  for (const StageConfig& stage : ring.stages) {
    if (stage.device.is_cuda()) stages_per_gpu[{stage.host, stage.device.index}]++;
  }

  RS_ASSIGN_OR_RETURN(const ControlCredentials creds,
                      MakeControlCredentials(ring.ring_secret_file));
  std::vector<std::unique_ptr<StageClient>> stages(num_stages);
  progress({.message = fmt::format("connecting to {} stage(s) (waiting up to {} each)", num_stages,
                                   absl::FormatDuration(options.connect_timeout))});
  RS_RETURN_IF_ERROR(ForEachStage(num_stages, [&](int i) -> absl::Status {
    RS_ASSIGN_OR_RETURN(stages[i], StageClient::Connect(i, ring.stages[i].endpoint(),
                                                        options.connect_timeout, creds));
    return absl::OkStatus();
  }));

  std::vector<std::string> data_endpoints(num_stages);
  RS_RETURN_IF_ERROR(ForEachStage(num_stages, [&](int i) -> absl::Status {
    const StageConfig& stage = ring.stages[i];
    v1::ConfigureRequest request;
    request.set_stage_index(i);
    request.set_num_stages(num_stages);
    request.set_model_dir(ring.model_dir);
    request.set_first_layer(stage.first_layer);
    request.set_last_layer(stage.last_layer);
    request.set_device(stage.device.ToString());
    request.set_kv_block_size(block_size);
    request.set_kv_num_blocks(kv_blocks[i]);
    request.set_kv_cache_dtype(std::string(KvCacheDtypeName(stage.kv_cache_dtype)));
    request.set_max_batch_tokens(ring.scheduler.max_tokens_per_micro_batch);
    if (i == num_stages - 1 && options.speculation.enabled()) {
      request.set_speculative_model_dir(options.speculation.draft_model_dir);
      request.set_speculative_mtp(options.speculation.mtp);
      request.set_num_speculative_tokens(options.speculation.num_tokens);
    }
    if (stage.device.is_cuda()) {
      request.set_memory_fraction(options.gpu_memory_utilization /
                                  stages_per_gpu[{stage.host, stage.device.index}]);
    }
    request.set_channel(std::string(ChannelKindName(ring.channel)));
    request.set_data_host(stage.host == "localhost" ? "127.0.0.1" : stage.host);
    request.set_recv_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(options.step_timeout)));
    if (options.stall_timeout > absl::ZeroDuration()) {
      request.set_activity_interval_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(
          std::clamp(options.stall_timeout / 4, absl::Milliseconds(50), absl::Seconds(1)))));
    }
    RS_ASSIGN_OR_RETURN(
        data_endpoints[i],
        stages[i]->Configure(request, options.configure_timeout, [&](const v1::LoadProgress& p) {
          if (p.ready()) kv_blocks[i] = p.kv_num_blocks();
          progress({.stage = i,
                    .endpoint = stage.endpoint(),
                    .message = p.message(),
                    .ready = p.ready()});
        }));
    return absl::OkStatus();
  }));
  const int kv_num_blocks = *std::min_element(kv_blocks.begin(), kv_blocks.end());
  if (kv_num_blocks < 1) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: a stage reported an empty KV pool ({} blocks)", ring.source, kv_num_blocks));
  }
  RS_RETURN_IF_ERROR(ForEachStage(num_stages, [&](int i) -> absl::Status {
    v1::ConnectPeersRequest request;
    if (i > 0) request.set_prev_data_endpoint(data_endpoints[i]);
    if (i + 1 < num_stages) request.set_next_data_endpoint(data_endpoints[i + 1]);
    request.set_token_back_edge(options.token_back_edge);
    if (options.token_back_edge && i == num_stages - 1 && i > 0) {
      request.set_first_data_endpoint(data_endpoints[0]);
    }
    request.set_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(options.connect_timeout)));
    return stages[i]->ConnectPeers(request, options.connect_timeout + absl::Seconds(5));
  }));
  progress({.message = fmt::format(
                "ring of {} stage(s) connected ({} channel, {} KV blocks of {} per stage)",
                num_stages, ChannelKindName(ring.channel), kv_num_blocks, block_size)});
  return FormedRing{
      .link = std::make_unique<GrpcRingLink>(
          std::move(stages), GrpcRingLinkOptions{.stall_timeout = options.stall_timeout}),
      .kv_num_blocks = kv_num_blocks};
}

}  // namespace ringserve
