#include "bench/cuda/prefill_table.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bench/cuda/event_timer.h"
#include "fmt/format.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"

namespace ringserve::cuda {
void PrefillTable(const ModelConfig& c, const KernelPlan& plan, const std::vector<int>& lengths,
                  std::string* out) {
  const LaunchStream stream(nullptr, plan.dependent_launch);
  absl::StatusOr<std::unique_ptr<GemmRunner>> runner = GemmRunner::Create();
  if (!runner.ok()) {
    *out += fmt::format("prefill table: {}\n", runner.status().ToString());
    return;
  }
  GemmRunner& gemm = **runner;
  const int h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int qkv_w = (c.num_heads + 2 * c.num_kv_heads) * d;
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {
      {"qkv", qkv_w, h}, {"o", h, c.num_heads * d}, {"gate_up", 2 * inter, h}, {"down", h, inter}};
  const int bs = 16;
  for (int n : lengths) {
    const int blocks = (n + bs - 1) / bs;
    const int64_t kv_elems = int64_t{blocks} * c.num_kv_heads * bs * d;
    DeviceBuffer w, x, y, k, v, q, attn, meta;
    const bool ok =
        w.Allocate(int64_t{2} * inter * h * 2).ok() && x.Allocate(int64_t{n} * inter * 2).ok() &&
        y.Allocate(int64_t{n} * 2 * inter * 2).ok() && k.Allocate(kv_elems * 2).ok() &&
        v.Allocate(kv_elems * 2).ok() && q.Allocate(int64_t{n} * c.num_heads * d * 2).ok() &&
        attn.Allocate(int64_t{n} * c.num_heads * d * 2).ok() &&
        meta.Allocate((blocks + 2 * (n / kPrefillTile + 1) + 8) * 4).ok();
    if (!ok) {
      *out += fmt::format("prefill table {}: allocation failed\n", n);
      continue;
    }
    (void)LaunchFillRandom(w.as<bf16>(), w.bytes() / 2, 11, 0, 0.03f, nullptr);
    for (DeviceBuffer* b : {&x, &k, &v, &q}) {
      (void)LaunchFillRandom(b->as<bf16>(), b->bytes() / 2, 12, 0, 1.0f, nullptr);
    }
    *out += fmt::format("prefill {} tokens, per layer:\n{:<24} {:>10} {:>9} {:>10} {:>9}\n", n,
                        "op", "heur_us", "TFLOP/s", "tuned_us", "TFLOP/s");
    double layer_us = 0;
    for (const Shape& s : shapes) {
      const double flops = 2.0 * n * s.n * s.k;
      auto run = [&] {
        return gemm.Linear(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, n, s.n, s.k,
                           nullptr);
      };
      const double heur_ms = TimeMs(run, 2, 10);
      (void)gemm.Tune(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, n, s.n, s.k, nullptr);
      const double tuned_ms = TimeMs(run, 2, 10);
      layer_us += 1000 * tuned_ms;
      *out += fmt::format("{:<24} {:>10.1f} {:>9.1f} {:>10.1f} {:>9.1f}\n",
                          fmt::format("{} m={}", s.name, n), 1000 * heur_ms, flops / heur_ms / 1e9,
                          1000 * tuned_ms, flops / tuned_ms / 1e9);
    }
    // One sequence of n tokens from position 0 (q rows 0.., block table 0..blocks-1), with each
    // kernel the device runs (64-query tiles: mma.sync; 128: wgmma on sm_90).
    const double attn_flops = 4.0 * d * c.num_heads * (double(n) * (n + 1) / 2);  // causal
    const AttentionShape shape{.num_heads = c.num_heads,
                               .scale = 0.088f,
                               .cache = {k.as<bf16>(), v.as<bf16>(), c.num_kv_heads, bs, d}};
    double best_attn_ms = 0;
    for (int tile_rows : {kPrefillTile, kPrefillTileSm90}) {
      if (tile_rows != kPrefillTile && tile_rows != plan.prefill_tile_rows) continue;
      std::vector<int32_t> tiles;
      MakePrefillTiles({n}, {0}, &tiles, tile_rows);
      std::vector<int32_t> m = {0, n, 0};
      for (int b = 0; b < blocks; ++b) m.push_back(b);
      const size_t tiles_at = m.size();
      m.insert(m.end(), tiles.begin(), tiles.end());
      cudaMemcpy(meta.get(), m.data(), m.size() * 4, cudaMemcpyHostToDevice);
      const int32_t* md = meta.as<int32_t>();
      const PrefillBatch batch{.q_starts = md,
                               .num_tokens = md + 1,
                               .start_positions = md + 2,
                               .block_tables = md + 3,
                               .max_blocks = blocks,
                               .tiles = md + tiles_at,
                               .num_tiles = static_cast<int>(tiles.size() / 2),
                               .tile_rows = tile_rows};  // key_tile set below
      // The wgmma kernel with each of its K/V tile sizes.
      for (int key_tile : {128, 64}) {
        if (tile_rows != kPrefillTileSm90 && key_tile != 128) continue;
        PrefillBatch keyed = batch;
        keyed.key_tile = key_tile;
        const double ms = TimeMs(
            [&] {
              return LaunchPrefillAttention(shape, q.as<bf16>(), attn.as<bf16>(), keyed, stream);
            },
            2, 5);
        if (best_attn_ms == 0 || ms < best_attn_ms) best_attn_ms = ms;
        const std::string name =
            tile_rows == kPrefillTileSm90
                ? fmt::format("attention, {}-q/{}-k tiles", tile_rows, key_tile)
                : fmt::format("attention, {}-q tiles", tile_rows);
        *out += fmt::format("{:<24} {:>10.1f} {:>9.1f}\n", name, 1000 * ms, attn_flops / ms / 1e9);
      }
    }
    layer_us += 1000 * best_attn_ms;
    // The memory-bound kernels between them: two residual-add + RMSNorms and the SiLU-mul.
    DeviceBuffer residual;
    if (residual.Allocate(int64_t{n} * h * 4).ok()) {
      // x ([n, inter] bf16) and y ([n, 2 inter]) hold the [n, h] delta and output.
      (void)LaunchBF16ToF32(x.as<bf16>(), residual.as<float>(), int64_t{n} * h, nullptr);
      const double norm_ms = TimeMs(
          [&] {
            return LaunchAddRmsNorm(residual.as<float>(), x.as<bf16>(), nullptr, w.as<bf16>(),
                                    y.as<bf16>(), n, h, 1e-5f, stream);
          },
          2, 10);
      const double silu_ms = TimeMs(
          [&] { return LaunchSiluMul(y.as<bf16>(), x.as<bf16>(), n, inter, stream); }, 2, 10);
      *out += fmt::format("{:<24} {:>10.1f} {:>9.0f} GB/s\n", "add + rmsnorm", 1000 * norm_ms,
                          12.0 * n * h / norm_ms / 1e6);
      *out += fmt::format("{:<24} {:>10.1f} {:>9.0f} GB/s\n", "silu * up", 1000 * silu_ms,
                          6.0 * n * inter / silu_ms / 1e6);
      layer_us += 1000 * (2 * norm_ms + silu_ms);
    }
    *out += fmt::format("{:<24} {:>10.1f} us/layer -> {:.0f} tok/s for {} layers (GEMMs tuned)\n",
                        "gemms, attention, norms", layer_us, n / (layer_us * 1e-6 * c.num_layers),
                        c.num_layers);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) *out += fmt::format("prefill table: {}\n", cudaGetErrorString(err));
  }
}

}  // namespace ringserve::cuda
