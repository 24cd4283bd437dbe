#include "stage/stage_backend.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/defaults.h"
#include "stage/model/slice_weights.h"

#ifdef RINGSERVE_HAVE_CUDA
#include "stage/channels/cuda_ipc/cuda_ipc_channel.h"
#include "stage/cuda/cuda_model_slice.h"
#endif
#ifdef RINGSERVE_HAVE_NCCL
#include "stage/channels/nccl/nccl_channel.h"
#endif

namespace ringserve {
namespace {

constexpr int kDefaultCudaBatchTokens = 8192;
constexpr int kMaxCudaSeqs = 1024;
constexpr int kIpcSlots = 4;

// -1 for "cpu" or empty; the ordinal for "cuda:N"; error otherwise.
absl::StatusOr<int> CudaOrdinal(const std::string& device) {
  if (device.empty() || device == "cpu") return -1;
  if (device == "cuda") return 0;
  int ordinal = -1;
  if (device.rfind("cuda:", 0) != 0 ||
      !absl::SimpleAtoi(absl::string_view(device).substr(5), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        fmt::format("device: '{}' is neither cpu nor cuda:N", device));
  }
  return ordinal;
}

bool HaveCuda() {
#ifdef RINGSERVE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool HaveNccl() {
#ifdef RINGSERVE_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace

absl::StatusOr<int64_t> StageDeviceMemoryBytes(const std::string& device) {
  RS_ASSIGN_OR_RETURN(int ordinal, CudaOrdinal(device));
  if (ordinal < 0) {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
      if (key == "MemAvailable:") return kib * 1024;
    }
    return absl::UnavailableError("device cpu: no MemAvailable in /proc/meminfo");
  }
#ifdef RINGSERVE_HAVE_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(ordinal) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    return absl::UnavailableError(fmt::format("device {}: cannot query its memory", device));
  }
  return static_cast<int64_t>(total_bytes);
#else
  return absl::UnimplementedError(
      fmt::format("device {}: this stage was built without the CUDA backend", device));
#endif
}

int StageValueBytes(const std::string& device) { return device.empty() || device == "cpu" ? 4 : 2; }

absl::Status CheckBackend(const v1::ConfigureRequest& request) {
  RS_ASSIGN_OR_RETURN(int ordinal, CudaOrdinal(request.device()));
  const bool cuda = ordinal >= 0;
  if (cuda && !HaveCuda()) {
    return absl::UnimplementedError(fmt::format(
        "device: '{}' needs the CUDA backend, and this stage was built without it (no CUDA "
        "toolkit at build time)",
        request.device()));
  }
  const std::string& channel = request.channel();
  if (channel.empty() || channel == "tcp") return absl::OkStatus();
  if (channel != "cuda_ipc" && channel != "nccl") {
    return absl::InvalidArgumentError(
        fmt::format("channel: '{}' is not one of tcp, cuda_ipc, nccl", channel));
  }
  if (!cuda) {
    return absl::InvalidArgumentError(fmt::format(
        "channel: '{}' moves activations between GPUs, but this stage's device is '{}' (use tcp "
        "for CPU stages)",
        channel, request.device().empty() ? "cpu" : request.device()));
  }
  if (channel == "nccl" && !HaveNccl()) {
    return absl::UnimplementedError(
        "channel: 'nccl' is not available: this stage was built without NCCL (use cuda_ipc on "
        "one host, or tcp)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelSlice>> LoadStageSlice(const v1::ConfigureRequest& request,
                                                           std::string* summary) {
  RS_RETURN_IF_ERROR(CheckBackend(request));
  SliceOptions options;
  options.model_dir = request.model_dir();
  options.layers = LayerRange{request.first_layer(), request.last_layer()};
  options.kv_block_size = request.kv_block_size();
  options.kv_num_blocks = request.kv_num_blocks();
  RS_ASSIGN_OR_RETURN(options.kv_cache_dtype,
                      ParseKvCacheDtype(request.kv_cache_dtype(), "kv_cache_dtype"));
  RS_ASSIGN_OR_RETURN(int ordinal, CudaOrdinal(request.device()));
  if (ordinal < 0) {
    if (options.kv_num_blocks < 1) {
      return absl::InvalidArgumentError(
          fmt::format("kv_num_blocks: {} < 1 (a CPU stage cannot size its pool from memory)",
                      options.kv_num_blocks));
    }
    RS_ASSIGN_OR_RETURN(std::unique_ptr<ModelSlice> slice, ModelSlice::LoadCpu(options));
    // Layer weights as the CPU slice holds them (fp32), every expert of a MoE layer counted.
    int64_t layer_bytes = 0;
    for (int layer = options.layers.first; layer < options.layers.last; ++layer) {
      layer_bytes += LayerWeightBytes(slice->config(), layer, sizeof(float));
    }
    const int64_t kv_token_bytes = slice->config().kv_values_per_token_layer() *
                                   KvCacheElementBytes(options.kv_cache_dtype, sizeof(float));
    *summary = fmt::format(
        "cpu, layer weights {} MiB, KV cache {}: {} blocks of {} = {} tokens, {} bytes per token "
        "and layer ({} per token over {} layers)",
        layer_bytes >> 20, KvCacheDtypeName(options.kv_cache_dtype), options.kv_num_blocks,
        options.kv_block_size, static_cast<int64_t>(options.kv_num_blocks) * options.kv_block_size,
        kv_token_bytes, kv_token_bytes * options.layers.size(), options.layers.size());
    return slice;
  }
#ifdef RINGSERVE_HAVE_CUDA
  cuda::CudaSliceOptions cuda;
  cuda.device = ordinal;
  cuda.max_batch_tokens =
      request.max_batch_tokens() > 0 ? request.max_batch_tokens() : kDefaultCudaBatchTokens;
  cuda.max_seqs = std::min(cuda.max_batch_tokens, kMaxCudaSeqs);
  cuda.max_logit_rows = cuda.max_seqs;
  cuda.kv_from_free_memory = options.kv_num_blocks == 0;
  cuda.device_share =
      request.memory_fraction() > 0 ? request.memory_fraction() : kDefaultGpuMemoryFraction;
  // The MTP layer (its weights, latent cache and hidden store) only when it will draft.
  cuda.load_mtp = request.speculative_mtp();
  RS_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModelSlice> slice,
                      cuda::CudaModelSlice::Load(options, cuda));
  const cuda::CudaMemoryReport m = slice->memory();
  *summary = fmt::format(
      "{}: weights {} MiB, KV cache {}: {} MiB, {} blocks of {} = {} tokens, {} bytes per token "
      "over {} layers{}; activations {} MiB; device {} of {} MiB free",
      request.device(), m.weight_bytes >> 20, KvCacheDtypeName(options.kv_cache_dtype),
      m.kv_bytes >> 20, m.kv_num_blocks, options.kv_block_size,
      static_cast<int64_t>(m.kv_num_blocks) * options.kv_block_size,
      m.kv_bytes /
          std::max<int64_t>(1, static_cast<int64_t>(m.kv_num_blocks) * options.kv_block_size),
      options.layers.size(),
      slice->mtp() ? fmt::format(" and the MTP layer (weights {} MiB, in the totals)",
                                 slice->mtp()->weight_bytes() >> 20)
                   : std::string(),
      m.activation_bytes >> 20, m.device_free_bytes >> 20, m.device_total_bytes >> 20);
  return std::unique_ptr<ModelSlice>(std::move(slice));
#else
  return absl::UnimplementedError("no CUDA backend in this build");
#endif
}

absl::StatusOr<StageChannels> ConnectStageChannels(const v1::ConfigureRequest& request,
                                                   const ModelSlice& slice, TcpListener* listener,
                                                   const std::string& next_endpoint,
                                                   absl::Duration timeout,
                                                   const RingSecret* secret) {
  const int index = request.stage_index();
  const bool first = index == 0;
  const bool last = index == request.num_stages() - 1;
  if (!first && listener == nullptr) {
    return absl::FailedPreconditionError("no activation listener on a stage that is not first");
  }
  StageChannels channels;
  const std::string& kind = request.channel();
  if (kind.empty() || kind == "tcp") {
    absl::Status accepted = absl::OkStatus();
    std::thread accept_thread;
    if (!first) {
      accept_thread = std::thread([&] {
        auto receiver = listener->Accept(index - 1, timeout);
        if (receiver.ok()) {
          channels.receiver = std::move(*receiver);
        } else {
          accepted = receiver.status();
        }
      });
    }
    absl::Status connected = absl::OkStatus();
    if (!last) {
      auto sender = TcpConnect(next_endpoint, index, timeout, secret);
      if (sender.ok()) {
        channels.sender = std::move(*sender);
      } else {
        connected = sender.status();
      }
    }
    if (accept_thread.joinable()) accept_thread.join();
    RS_RETURN_IF_ERROR(connected);
    RS_RETURN_IF_ERROR(accepted);
    return channels;
  }

  const ActivationBuffer& activations = slice.activations();
  if (activations.memory() != MemorySpace::kDevice) {
    return absl::FailedPreconditionError(
        fmt::format("channel: '{}' needs a CUDA stage (device cuda:N)", kind));
  }
  const int device = activations.device();
  (void)device;  // unused in a build without the GPU channels
  // Links first (both directions at once), then the GPU channel handshakes, also at once.
  absl::StatusOr<std::unique_ptr<TcpLink>> in_link = std::unique_ptr<TcpLink>();
  absl::StatusOr<std::unique_ptr<TcpLink>> out_link = std::unique_ptr<TcpLink>();
  {
    std::thread accept_thread;
    if (!first) {
      accept_thread = std::thread([&] { in_link = listener->AcceptLink(index - 1, timeout); });
    }
    if (!last) out_link = TcpConnectLink(next_endpoint, index, timeout, secret);
    if (accept_thread.joinable()) accept_thread.join();
    RS_RETURN_IF_ERROR(out_link.status());
    RS_RETURN_IF_ERROR(in_link.status());
  }
  absl::Status in_status = absl::OkStatus();
  absl::Status out_status = absl::OkStatus();
  std::thread in_thread;
  if (!first) {
    in_thread = std::thread([&] {
      absl::StatusOr<std::unique_ptr<DeviceActivationReceiver>> receiver =
          absl::UnimplementedError(kind);
#ifdef RINGSERVE_HAVE_CUDA
      if (kind == "cuda_ipc") {
        const int64_t slot_bytes =
            activations.max_tokens() * activations.hidden_size() * int64_t{sizeof(float)};
        receiver = CudaIpcAccept(
            std::move(*in_link),
            CudaIpcOptions{.device = device, .num_slots = kIpcSlots, .slot_bytes = slot_bytes},
            timeout);
      }
#endif
#ifdef RINGSERVE_HAVE_NCCL
      if (kind == "nccl") receiver = NcclAccept(std::move(*in_link), device, timeout);
#endif
      if (receiver.ok()) {
        channels.device_receiver = std::move(*receiver);
      } else {
        in_status = receiver.status();
      }
    });
  }
  if (!last) {
    absl::StatusOr<std::unique_ptr<DeviceActivationSender>> sender = absl::UnimplementedError(kind);
#ifdef RINGSERVE_HAVE_CUDA
    if (kind == "cuda_ipc") {
      // RINGSERVE_CUDA_IPC_COPY_STREAM=auto|always|never: whether transfers get their own stream
      // (default auto: between different GPUs).
      const char* mode_env = std::getenv("RINGSERVE_CUDA_IPC_COPY_STREAM");
      const std::optional<CopyStreamMode> mode =
          ParseCopyStreamMode(mode_env == nullptr ? "auto" : mode_env);
      sender = mode.has_value()
                   ? CudaIpcConnect(std::move(*out_link),
                                    CudaIpcOptions{.device = device, .copy_stream = *mode}, timeout)
                   : absl::InvalidArgumentError(fmt::format(
                         "RINGSERVE_CUDA_IPC_COPY_STREAM is '{}'; expected auto, always or never",
                         mode_env));
    }
#endif
#ifdef RINGSERVE_HAVE_NCCL
    if (kind == "nccl") sender = NcclConnect(std::move(*out_link), device, timeout);
#endif
    if (sender.ok()) {
      channels.device_sender = std::move(*sender);
    } else {
      out_status = sender.status();
    }
  }
  if (in_thread.joinable()) in_thread.join();
  RS_RETURN_IF_ERROR(out_status);
  RS_RETURN_IF_ERROR(in_status);
  return channels;
}

}  // namespace ringserve
