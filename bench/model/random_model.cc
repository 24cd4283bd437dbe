#include "bench/model/random_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "bench/model/deepseek_random_shape.h"
#include "bench/model/quant_layout.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ringserve {
namespace {

// A decoder layer's linear weight, which --quant stores quantized: the *_proj weights (attention,
// dense MLP, experts, shared experts) and DeepSeek's kv_a_proj_with_mqa, as the loader reads them
// (stage/model/slice_weights.h: TensorSpec::linear).
bool IsDecoderLinear(const std::string& name) {
  return name.starts_with("model.layers.") &&
         (name.ends_with("_proj.weight") || name.ends_with("_proj_with_mqa.weight"));
}

namespace fs = std::filesystem;

constexpr int64_t kChunkElements = int64_t{1} << 20;  // one RNG stream per chunk
constexpr int64_t kPieceChunks = 32;                  // chunks generated per write

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

DType DTypeOf(const CheckpointTensor& spec, const RandomModelOptions& options) {
  return spec.dtype.value_or(options.dtype);
}

// The next value of a chunk's xorshift stream.
uint64_t NextRandom(uint64_t& state) {
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return state * 0x2545f4914f6cdd1dull;
}

// Fills `count` elements of `dtype` at `out` for chunk `chunk` of a tensor.
void FillChunk(const CheckpointTensor& spec, uint64_t tensor_key, int64_t chunk, int64_t count,
               DType dtype, double init_std, uint8_t* out) {
  const size_t element_size = DTypeSize(dtype);
  using Fill = CheckpointTensor::Fill;
  auto store = [&](int64_t i, float value) {
    uint8_t* at = out + i * element_size;
    if (dtype == DType::kBF16) {
      uint16_t bits = FloatToBF16(value);
      std::memcpy(at, &bits, 2);
    } else if (dtype == DType::kF16) {
      uint16_t bits = FloatToHalf(value);
      std::memcpy(at, &bits, 2);
    } else {
      std::memcpy(at, &value, 4);
    }
  };
  if (spec.is_norm || spec.fill == Fill::kConstant) {
    for (int64_t i = 0; i < count; ++i) store(i, spec.is_norm ? 1.0f : spec.constant);
    return;
  }
  if (spec.fill == Fill::kInts) {  // I64, one small chunk
    for (int64_t i = 0; i < count; ++i) std::memcpy(out + i * 8, &spec.ints.at(i), 8);
    return;
  }
  uint64_t state = SplitMix64(tensor_key ^ SplitMix64(static_cast<uint64_t>(chunk)));
  if (state == 0) state = 1;
  if (spec.fill == Fill::kRandomBits || spec.fill == Fill::kRandomE4m3) {
    const int64_t bytes = count * static_cast<int64_t>(element_size);
    for (int64_t b = 0; b < bytes; b += 8) {
      const uint64_t r = NextRandom(state);
      std::memcpy(out + b, &r, static_cast<size_t>(std::min<int64_t>(8, bytes - b)));
    }
    if (spec.fill == Fill::kRandomE4m3) {  // 0x7f / 0xff are NaN: the largest finite instead
      for (int64_t b = 0; b < bytes; ++b) {
        if ((out[b] & 0x7f) == 0x7f) --out[b];
      }
    }
    return;
  }
  // Irwin-Hall(4) of 16-bit uniforms: mean 2, variance 1/3 -> scale to the wanted std.
  const float scale = static_cast<float>(init_std * std::sqrt(3.0) / 65536.0);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = NextRandom(state);
    const int64_t sum = static_cast<int64_t>(r & 0xffff) + ((r >> 16) & 0xffff) +
                        ((r >> 32) & 0xffff) + (r >> 48) - 2 * 65536;
    store(i, static_cast<float>(sum) * scale);
  }
}

absl::Status WriteAll(int fd, const uint8_t* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(fmt::format("writing {}: {}", path, std::strerror(errno)));
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

// Writes one safetensors file holding `specs` in order.
absl::Status WriteShard(const std::string& path, const std::vector<const CheckpointTensor*>& specs,
                        const RandomModelOptions& options, int num_threads) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const CheckpointTensor* spec : specs) {
    const uint64_t bytes =
        static_cast<uint64_t>(spec->NumElements()) * DTypeSize(DTypeOf(*spec, options));
    header[spec->name] = {{"dtype", std::string(DTypeName(DTypeOf(*spec, options)))},
                          {"shape", spec->shape},
                          {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  // The data section starts 8-byte aligned; safetensors pads the header with spaces.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(fmt::format("creating {}: {}", path, std::strerror(errno)));
  }
  auto close_fd = [&]() -> absl::Status {
    if (::close(fd) != 0) {
      return absl::InternalError(fmt::format("closing {}: {}", path, std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  uint8_t length_bytes[8];
  uint64_t header_size = header_text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(header_size >> (8 * i));
  absl::Status status = WriteAll(fd, length_bytes, 8, path);
  if (status.ok()) {
    status = WriteAll(fd, reinterpret_cast<const uint8_t*>(header_text.data()), header_text.size(),
                      path);
  }

  // Double buffering: generate piece k+1 while piece k is being written.
  size_t largest = 0;  // bytes of the largest piece
  for (const CheckpointTensor* spec : specs) {
    largest = std::max(
        largest, static_cast<size_t>(std::min(spec->NumElements(), kPieceChunks * kChunkElements)) *
                     DTypeSize(DTypeOf(*spec, options)));
  }
  std::vector<uint8_t> buffers[2];
  for (auto& buffer : buffers) buffer.resize(largest);
  std::future<absl::Status> pending;
  int current = 0;
  for (const CheckpointTensor* spec : specs) {
    if (!status.ok()) break;
    const uint64_t key = SplitMix64(options.seed) ^ Fnv1a(spec->name);
    const DType dtype = DTypeOf(*spec, options);
    const size_t element_size = DTypeSize(dtype);
    const int64_t elements = spec->NumElements();
    const int64_t chunks = (elements + kChunkElements - 1) / kChunkElements;
    for (int64_t first = 0; first < chunks && status.ok(); first += kPieceChunks) {
      const int64_t last = std::min(chunks, first + kPieceChunks);
      uint8_t* out = buffers[current].data();
      auto generate = [&](int thread) {
        for (int64_t c = first + thread; c < last; c += num_threads) {
          const int64_t begin = c * kChunkElements;
          const int64_t count = std::min(kChunkElements, elements - begin);
          FillChunk(*spec, key, c, count, dtype, options.init_std,
                    out + (c - first) * kChunkElements * element_size);
        }
      };
      std::vector<std::thread> threads;
      const int used = static_cast<int>(std::min<int64_t>(num_threads, last - first));
      for (int t = 1; t < used; ++t) threads.emplace_back(generate, t);
      generate(0);
      for (auto& thread : threads) thread.join();
      const size_t bytes =
          static_cast<size_t>(std::min(elements, last * kChunkElements) - first * kChunkElements) *
          element_size;
      if (pending.valid()) status = pending.get();
      if (!status.ok()) break;
      pending = std::async(std::launch::async,
                           [fd, out, bytes, &path] { return WriteAll(fd, out, bytes, path); });
      current ^= 1;
    }
  }
  if (pending.valid()) {
    absl::Status last = pending.get();
    if (status.ok()) status = last;
  }
  absl::Status closed = close_fd();
  return status.ok() ? closed : status;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(fmt::format("writing {}", path.string()));
  return absl::OkStatus();
}

}  // namespace

int64_t CheckpointTensor::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::vector<std::string> KnownShapeNames() {
  return {"llama-3.1-8b", "qwen3-8b",   "qwen3-30b-a3b",  "deepseek-v3",      "glm-4.5-air",
          "tiny",         "tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-glm4-moe"};
}

absl::StatusOr<ModelShape> FindShape(const std::string& name) {
  ModelShape llama{.name = name,
                   .architecture = "LlamaForCausalLM",
                   .model_type = "llama",
                   .tokenizer = "llama3",
                   .hidden_size = 4096,
                   .intermediate_size = 14336,
                   .num_layers = 32,
                   .num_heads = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .vocab_size = 128256,
                   .max_position_embeddings = 131072,
                   .rms_norm_eps = 1e-5,
                   .rope_theta = 500000.0,
                   .llama3_rope_scaling = true,
                   .qk_norm = false,
                   .tie_word_embeddings = false,
                   .bos_token_id = 128000,
                   .eos_token_ids = {128001, 128008, 128009}};
  ModelShape qwen3{.name = name,
                   .architecture = "Qwen3ForCausalLM",
                   .model_type = "qwen3",
                   .tokenizer = "qwen3",
                   .hidden_size = 4096,
                   .intermediate_size = 12288,
                   .num_layers = 36,
                   .num_heads = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .vocab_size = 151936,
                   .max_position_embeddings = 40960,
                   .rms_norm_eps = 1e-6,
                   .rope_theta = 1000000.0,
                   .llama3_rope_scaling = false,
                   .qk_norm = true,
                   .tie_word_embeddings = false,
                   .bos_token_id = 151643,
                   .eos_token_ids = {151645}};
  auto tiny = [](ModelShape shape) {
    shape.hidden_size = 64;
    shape.intermediate_size = 128;
    shape.num_layers = 2;
    shape.num_heads = 4;
    shape.num_kv_heads = 2;
    shape.head_dim = 16;
    shape.max_position_embeddings = 4096;
    shape.tie_word_embeddings = true;
    return shape;
  };
  // Qwen3-30B-A3B's config.json: 30.5 B parameters, 3.3 B active.
  ModelShape qwen3_moe = qwen3;
  qwen3_moe.architecture = "Qwen3MoeForCausalLM";
  qwen3_moe.model_type = "qwen3_moe";
  qwen3_moe.hidden_size = 2048;
  qwen3_moe.intermediate_size = 6144;
  qwen3_moe.num_layers = 48;
  qwen3_moe.num_heads = 32;
  qwen3_moe.num_kv_heads = 4;
  qwen3_moe.num_experts = 128;
  qwen3_moe.num_experts_per_tok = 8;
  qwen3_moe.moe_intermediate_size = 768;
  // GLM-4.5-Air's config.json: 106 B parameters, 12 B active.
  ModelShape glm{.name = name,
                 .architecture = "Glm4MoeForCausalLM",
                 .model_type = "glm4_moe",
                 .tokenizer = "",
                 .hidden_size = 4096,
                 .intermediate_size = 10944,
                 .num_layers = 46,
                 .num_heads = 96,
                 .num_kv_heads = 8,
                 .head_dim = 128,
                 .vocab_size = 151552,
                 .max_position_embeddings = 131072,
                 .rms_norm_eps = 1e-5,
                 .rope_theta = 1000000.0,
                 .llama3_rope_scaling = false,
                 .qk_norm = false,
                 .tie_word_embeddings = false,
                 .bos_token_id = 151329,
                 .eos_token_ids = {151329, 151336, 151338},
                 .num_experts = 128,
                 .num_experts_per_tok = 8,
                 .moe_intermediate_size = 1408,
                 .n_shared_experts = 1,
                 .first_k_dense_replace = 1,
                 .n_group = 1,
                 .topk_group = 1,
                 .routed_scaling_factor = 1.0,
                 .partial_rotary_factor = 0.5,
                 .attention_bias = true};
  if (name == "glm-4.5-air") return glm;
  if (name == "tiny-glm4-moe") {
    ModelShape shape = tiny(glm);
    shape.num_layers = 3;
    shape.num_experts = 8;
    shape.moe_intermediate_size = 32;
    shape.num_experts_per_tok = 2;
    shape.n_group = 4;
    shape.topk_group = 2;
    shape.routed_scaling_factor = 2.5;
    return shape;
  }
  if (name == "llama-3.1-8b") return llama;
  if (name == "qwen3-8b") return qwen3;
  if (name == "qwen3-30b-a3b") return qwen3_moe;
  if (name == "deepseek-v3") return DeepseekV3Shape(name, /*tiny=*/false);
  if (name == "tiny-deepseek-v3") return DeepseekV3Shape(name, /*tiny=*/true);
  if (name == "tiny") return tiny(llama);
  if (name == "tiny-qwen3") return tiny(qwen3);
  if (name == "tiny-qwen3-moe") {
    ModelShape shape = tiny(qwen3_moe);
    shape.num_experts = 8;
    shape.num_experts_per_tok = 2;
    shape.moe_intermediate_size = 32;
    return shape;
  }
  std::string known;
  for (const std::string& shape : KnownShapeNames()) known += (known.empty() ? "" : ", ") + shape;
  return absl::NotFoundError(fmt::format("unknown model shape '{}' (known: {})", name, known));
}

std::string ConfigJson(const ModelShape& shape, DType dtype, CheckpointQuant quant) {
  nlohmann::ordered_json config;
  config["architectures"] = {shape.architecture};
  config["model_type"] = shape.model_type;
  config["hidden_size"] = shape.hidden_size;
  config["intermediate_size"] = shape.intermediate_size;
  config["num_hidden_layers"] = shape.num_layers;
  config["num_attention_heads"] = shape.num_heads;
  config["num_key_value_heads"] = shape.num_kv_heads;
  config["head_dim"] = shape.head_dim;
  config["vocab_size"] = shape.vocab_size;
  config["max_position_embeddings"] = shape.max_position_embeddings;
  config["rms_norm_eps"] = shape.rms_norm_eps;
  config["rope_theta"] = shape.rope_theta;
  if (shape.llama3_rope_scaling) {
    config["rope_scaling"] = {{"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192},
                              {"rope_type", "llama3"}};
  } else {
    config["rope_scaling"] = nullptr;
  }
  config["hidden_act"] = "silu";
  config["attention_bias"] = shape.attention_bias;
  config["attention_dropout"] = 0.0;
  if (shape.model_type == "glm4_moe") {
    config["n_routed_experts"] = shape.num_experts;
    config["num_experts_per_tok"] = shape.num_experts_per_tok;
    config["moe_intermediate_size"] = shape.moe_intermediate_size;
    config["n_shared_experts"] = shape.n_shared_experts;
    config["first_k_dense_replace"] = shape.first_k_dense_replace;
    config["n_group"] = shape.n_group;
    config["topk_group"] = shape.topk_group;
    config["routed_scaling_factor"] = shape.routed_scaling_factor;
    config["norm_topk_prob"] = true;
    config["partial_rotary_factor"] = shape.partial_rotary_factor;
    config["use_qk_norm"] = shape.qk_norm;
  } else if (shape.model_type == "llama") {
    config["mlp_bias"] = false;
    config["pretraining_tp"] = 1;
  } else {
    config["use_sliding_window"] = false;
    config["sliding_window"] = nullptr;
    config["max_window_layers"] = shape.num_layers;
  }
  if (shape.mla.enabled()) {
    AddDeepseekConfig(shape, config);
  } else if (shape.num_experts > 0 && shape.model_type != "glm4_moe") {
    config["num_experts"] = shape.num_experts;
    config["num_experts_per_tok"] = shape.num_experts_per_tok;
    config["moe_intermediate_size"] = shape.moe_intermediate_size;
    config["norm_topk_prob"] = true;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  config["initializer_range"] = 0.02;
  config["tie_word_embeddings"] = shape.tie_word_embeddings;
  config["bos_token_id"] = shape.bos_token_id;
  if (shape.eos_token_ids.size() == 1) {
    config["eos_token_id"] = shape.eos_token_ids[0];
  } else {
    config["eos_token_id"] = shape.eos_token_ids;
  }
  config["torch_dtype"] = dtype == DType::kBF16  ? "bfloat16"
                          : dtype == DType::kF16 ? "float16"
                                                 : "float32";
  config["use_cache"] = true;
  if (quant != CheckpointQuant::kNone) config["quantization_config"] = QuantizationConfig(quant);
  config["transformers_version"] = "4.51.0";
  return config.dump(2) + "\n";
}

std::vector<CheckpointTensor> CheckpointTensors(const ModelShape& shape, CheckpointQuant quant,
                                                double init_std) {
  return CheckpointTensors(shape, 0, shape.num_layers, quant, init_std);
}

std::vector<CheckpointTensor> CheckpointTensors(const ModelShape& shape, int first_layer,
                                                int last_layer, CheckpointQuant quant,
                                                double init_std) {
  const int64_t hidden = shape.hidden_size;
  const int64_t q = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
  const int64_t kv = static_cast<int64_t>(shape.num_kv_heads) * shape.head_dim;
  const int64_t inter = shape.intermediate_size;
  std::vector<CheckpointTensor> specs;
  if (first_layer == 0) {
    specs.push_back({"model.embed_tokens.weight", {shape.vocab_size, hidden}, false});
  }
  for (int layer = first_layer; layer < last_layer; ++layer) {
    if (shape.mla.enabled()) {
      AppendDeepseekLayerTensors(shape, layer, specs);
      continue;
    }
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    specs.push_back({prefix + "input_layernorm.weight", {hidden}, true});
    specs.push_back({prefix + "self_attn.q_proj.weight", {q, hidden}, false});
    if (shape.attention_bias) specs.push_back({prefix + "self_attn.q_proj.bias", {q}, false});
    specs.push_back({prefix + "self_attn.k_proj.weight", {kv, hidden}, false});
    if (shape.attention_bias) specs.push_back({prefix + "self_attn.k_proj.bias", {kv}, false});
    specs.push_back({prefix + "self_attn.v_proj.weight", {kv, hidden}, false});
    if (shape.attention_bias) specs.push_back({prefix + "self_attn.v_proj.bias", {kv}, false});
    specs.push_back({prefix + "self_attn.o_proj.weight", {hidden, q}, false});
    if (shape.qk_norm) {
      specs.push_back({prefix + "self_attn.q_norm.weight", {shape.head_dim}, true});
      specs.push_back({prefix + "self_attn.k_norm.weight", {shape.head_dim}, true});
    }
    specs.push_back({prefix + "post_attention_layernorm.weight", {hidden}, true});
    if (shape.num_experts > 0 && layer >= shape.first_k_dense_replace) {
      const int64_t moe_inter = shape.moe_intermediate_size;
      specs.push_back({prefix + "mlp.gate.weight", {shape.num_experts, hidden}, false});
      if (shape.model_type == "glm4_moe") {
        specs.push_back({prefix + "mlp.gate.e_score_correction_bias", {shape.num_experts}, false});
      }
      for (int e = 0; e < shape.num_experts; ++e) {
        const std::string expert = fmt::format("{}mlp.experts.{}.", prefix, e);
        specs.push_back({expert + "gate_proj.weight", {moe_inter, hidden}, false});
        specs.push_back({expert + "up_proj.weight", {moe_inter, hidden}, false});
        specs.push_back({expert + "down_proj.weight", {hidden, moe_inter}, false});
      }
      if (shape.n_shared_experts > 0) {
        const int64_t shared = moe_inter * shape.n_shared_experts;
        const std::string sp = prefix + "mlp.shared_experts.";
        specs.push_back({sp + "gate_proj.weight", {shared, hidden}, false});
        specs.push_back({sp + "up_proj.weight", {shared, hidden}, false});
        specs.push_back({sp + "down_proj.weight", {hidden, shared}, false});
      }
      continue;
    }
    specs.push_back({prefix + "mlp.gate_proj.weight", {inter, hidden}, false});
    specs.push_back({prefix + "mlp.up_proj.weight", {inter, hidden}, false});
    specs.push_back({prefix + "mlp.down_proj.weight", {hidden, inter}, false});
  }
  if (last_layer == shape.num_layers) {
    specs.push_back({"model.norm.weight", {hidden}, true});
    if (!shape.tie_word_embeddings) {
      specs.push_back({"lm_head.weight", {shape.vocab_size, hidden}, false});
    }
  }
  if (quant == CheckpointQuant::kNone) return specs;
  // The decoder layers' linear weights as their quantized parts (WriteRandomModel checks that
  // they pack; one that does not stays as it is here).
  std::vector<CheckpointTensor> quantized;
  for (const CheckpointTensor& spec : specs) {
    const bool linear = IsDecoderLinear(spec.name);
    absl::StatusOr<std::vector<CheckpointTensor>> parts =
        linear ? QuantizedParts(spec, quant, init_std)
               : absl::StatusOr<std::vector<CheckpointTensor>>(std::vector{spec});
    if (!parts.ok()) parts = std::vector{spec};
    quantized.insert(quantized.end(), parts->begin(), parts->end());
  }
  return quantized;
}

absl::StatusOr<RandomModelResult> WriteRandomModel(const RandomModelOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const ModelShape& shape = options.shape;
  if (options.output_dir.empty()) return absl::InvalidArgumentError("no output directory");
  if (shape.num_layers < 1 || shape.hidden_size < 1 || shape.vocab_size < 1 ||
      shape.num_heads < 1 || shape.num_kv_heads < 1 || shape.num_heads % shape.num_kv_heads) {
    return absl::InvalidArgumentError(fmt::format("model shape '{}' is not valid", shape.name));
  }
  if (options.max_shard_bytes < 1) return absl::InvalidArgumentError("max_shard_bytes < 1");
  const int last_layer = options.last_layer > 0 ? options.last_layer : shape.num_layers;
  if (options.first_layer < 0 || options.first_layer >= last_layer ||
      last_layer > shape.num_layers) {
    return absl::InvalidArgumentError(
        fmt::format("layers [{}, {}) are not a non-empty part of the {} layers of '{}'",
                    options.first_layer, last_layer, shape.num_layers, shape.name));
  }
  const fs::path dir(options.output_dir);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(fmt::format("creating {}: {}", dir.string(), error.message()));
  }
  // Files of an earlier run with another shard count would confuse the loader.
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    if (file.ends_with(".safetensors") || file == "model.safetensors.index.json") {
      fs::remove(entry.path(), error);
    }
  }

  std::vector<std::string> tokenizer_files;
  if (!options.tokenizers_dir.empty() && !shape.tokenizer.empty()) {
    const fs::path from = fs::path(options.tokenizers_dir) / shape.tokenizer;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      if (!fs::exists(from / name)) {
        return absl::NotFoundError(
            fmt::format("tokenizer file {} is missing (run "
                        "scripts/install_deps.sh)",
                        (from / name).string()));
      }
      tokenizer_files.push_back((from / name).string());
    }
  }

  // Every linear weight must pack into the quantized layout.
  for (const CheckpointTensor& spec : CheckpointTensors(shape)) {
    if (options.quant != CheckpointQuant::kNone && IsDecoderLinear(spec.name)) {
      RS_RETURN_IF_ERROR(QuantizedParts(spec, options.quant, options.init_std).status());
    }
  }
  // Shards: consecutive tensors up to max_shard_bytes each (a larger tensor gets its own).
  const std::vector<CheckpointTensor> specs =
      CheckpointTensors(shape, options.first_layer, last_layer, options.quant, options.init_std);
  std::vector<std::vector<const CheckpointTensor*>> shards(1);
  int64_t shard_bytes = 0;
  RandomModelResult result;
  for (const CheckpointTensor& spec : specs) {
    const int64_t bytes =
        spec.NumElements() * static_cast<int64_t>(DTypeSize(DTypeOf(spec, options)));
    if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&spec);
    shard_bytes += bytes;
    result.total_bytes += bytes;
  }

  const int num_threads = options.num_threads > 0
                              ? options.num_threads
                              : std::max(1u, std::thread::hardware_concurrency());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? std::string("model.safetensors")
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              i + 1, shards.size());
    RS_RETURN_IF_ERROR(WriteShard((dir / file).string(), shards[i], options, num_threads));
    for (const CheckpointTensor* spec : shards[i]) weight_map[spec->name] = file;
    result.files.push_back(file);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", result.total_bytes}};
    index["weight_map"] = weight_map;
    RS_RETURN_IF_ERROR(WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  }
  RS_RETURN_IF_ERROR(
      WriteText(dir / "config.json", ConfigJson(shape, options.dtype, options.quant)));
  nlohmann::ordered_json generation;
  generation["bos_token_id"] = shape.bos_token_id;
  generation["eos_token_id"] = shape.eos_token_ids;
  generation["do_sample"] = false;
  RS_RETURN_IF_ERROR(WriteText(dir / "generation_config.json", generation.dump(2) + "\n"));
  for (const std::string& from : tokenizer_files) {
    fs::copy_file(from, dir / fs::path(from).filename(), fs::copy_options::overwrite_existing,
                  error);
    if (error) {
      return absl::InternalError(fmt::format("copying {}: {}", from, error.message()));
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace ringserve
