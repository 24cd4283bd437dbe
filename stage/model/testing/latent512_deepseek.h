// DeepSeek-V3 at the latent sizes of the real models and of the CUDA MLA kernels (kv_lora_rank
// 512, qk_rope_head_dim 64; the fixtures' 16 run on the CPU only), small everywhere else: the
// random models the MLA tests (CPU and CUDA) write. Test code only; header-only over
// bench/model/random_model.h, so callers link rs_random_model.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/model/random_model.h"

namespace ringserve::testing {

// tiny-deepseek-v3's layout named `name`: hidden 128, 3 layers of 4 heads, q_lora_rank
// `q_lora_rank` (0: a plain q_proj), kv_lora_rank 512, qk_nope 32, qk_rope 64, v_head 32,
// `vocab_size` tokens, 128 positions, bos 1, eos 2. YaRN is left as tiny-deepseek-v3 has it.
inline absl::StatusOr<ModelShape> Latent512DeepseekShape(const std::string& name, int vocab_size,
                                                         int q_lora_rank = 32) {
  absl::StatusOr<ModelShape> shape = FindShape("tiny-deepseek-v3");
  if (!shape.ok()) return shape.status();
  shape->name = name;
  shape->hidden_size = 128;
  shape->num_layers = 3;
  shape->num_heads = 4;
  shape->num_kv_heads = 4;
  shape->head_dim = 64;
  shape->vocab_size = vocab_size;
  shape->max_position_embeddings = 128;
  shape->bos_token_id = 1;
  shape->eos_token_ids = {2};
  shape->mla.q_lora_rank = q_lora_rank;
  shape->mla.kv_lora_rank = 512;
  shape->mla.qk_nope_head_dim = 32;
  shape->mla.qk_rope_head_dim = 64;
  shape->mla.v_head_dim = 32;
  return shape;
}

// Writes to `dir` the float (bf16) source model that the quantized MoE tests quantize, CPU and
// CUDA alike: Latent512DeepseekShape with 128 tokens and YaRN (factor 4 over 16 positions), MoE
// from layer 1 with a shared expert, random weights (seed 11, std 0.1).
inline absl::Status WriteLatent512Moe(const std::string& dir) {
  absl::StatusOr<ModelShape> shape = Latent512DeepseekShape("tiny-deepseek-v3-latent512-moe", 128);
  if (!shape.ok()) return shape.status();
  shape->mla.yarn_factor = 4;
  shape->mla.yarn_original_max_position_embeddings = 16;
  return WriteRandomModel({.output_dir = dir,
                           .shape = *shape,
                           .seed = 11,
                           .init_std = 0.1,
                           .num_threads = 2,
                           .tokenizers_dir = ""})
      .status();
}

}  // namespace ringserve::testing
