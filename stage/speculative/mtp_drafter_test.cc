// The MTP drafter feeds the MTP layer incrementally, step by step, across a verification: its
// drafts equal those of the layer fed every (h_p, t_{p+1}) pair of the verified tokens at once
// from a fresh target (DeepSeek-V3 fixture with a dense MTP layer, CPU).
#include "stage/speculative/mtp_drafter.h"

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

constexpr char kModel[] = "tests/fixtures/models/deepseek_v3";

std::unique_ptr<CpuModelSlice> Load() {
  auto slice = CpuModelSlice::Load(
      {.model_dir = kModel, .layers = {0, 4}, .kv_block_size = 4, .kv_num_blocks = 32});
  EXPECT_TRUE(slice.ok()) << slice.status();
  return slice.ok() ? *std::move(slice) : nullptr;
}

MicroBatch Chunk(int32_t start, std::vector<int32_t> ids, LogitsMode logits) {
  MicroBatch batch;
  batch.chunks.push_back(SequenceChunk{.seq_id = 1,
                                       .start_position = start,
                                       .num_tokens = static_cast<int32_t>(ids.size()),
                                       .block_table = {0, 1, 2, 3, 4, 5},
                                       .logits = logits});
  batch.token_ids = std::move(ids);
  return batch;
}

// The MTP layer's greedy draft after `tokens` (all verified), from a fresh target.
int32_t ReferenceDraft(const std::vector<int32_t>& tokens) {
  std::unique_ptr<CpuModelSlice> target = Load();
  MicroBatch all =
      Chunk(0, std::vector<int32_t>(tokens.begin(), tokens.end() - 1), LogitsMode::kLastToken);
  EXPECT_TRUE(target->Forward(all, {}).ok());
  const int64_t hidden = target->config().hidden_size;
  const int64_t rows = all.TotalTokens();
  std::vector<float> h(rows * hidden);
  cpu::RmsNorm(target->activations().data(), target->final_norm().data(), rows, hidden,
               target->config().rms_norm_eps, h.data());
  MicroBatch pairs =
      Chunk(0, std::vector<int32_t>(tokens.begin() + 1, tokens.end()), LogitsMode::kLastToken);
  auto logits = target->mtp()->Forward(pairs, h);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? GreedyToken(*logits) : -1;
}

TEST(MtpDrafterTest, IncrementalDraftsEqualTheLayerFedAtOnce) {
  std::unique_ptr<CpuModelSlice> target = Load();
  ASSERT_NE(target, nullptr);
  ASSERT_NE(target->mtp(), nullptr);
  MtpDrafter drafter(target.get());
  const std::vector<int32_t> prompt = {5, 17, 42, 9, 100, 23, 64, 7, 81, 33};
  const int32_t n = static_cast<int32_t>(prompt.size());

  // Step 1: the prompt; the target samples t, the drafter drafts d1.
  DecodedPlan plan;
  plan.batch = Chunk(0, prompt, LogitsMode::kLastToken);
  plan.outputs = {ChunkOutput{
      .samples = true, .speculation = {.active = true, .context_ids = prompt, .propose = 1}}};
  auto logits = target->Forward(plan.batch, {});
  ASSERT_TRUE(logits.ok());
  const int32_t t = GreedyToken(*logits);
  drafter.Sync(1, plan.outputs[0].speculation);
  ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
  Drafter::Request request{.seq_id = 1, .emitted = {t}, .k = 1};
  auto first = drafter.Propose(std::span<const Drafter::Request>(&request, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)[0].size(), 1u);
  const int32_t d1 = (*first)[0][0];
  std::vector<int32_t> verified = prompt;
  verified.push_back(t);
  EXPECT_EQ(d1, ReferenceDraft(verified));

  // Step 2: the verification chunk [t, d1]; greedy verification emits what the target says.
  plan.batch = Chunk(n, {t, d1}, LogitsMode::kAllTokens);
  plan.outputs = {ChunkOutput{
      .samples = true,
      .speculation = {.active = true, .context_start = n, .context_ids = {t}, .draft_ids = {d1}}}};
  auto rows = target->Forward(plan.batch, {});
  ASSERT_TRUE(rows.ok());
  const size_t vocab = static_cast<size_t>(target->config().vocab_size);
  const int32_t row0 = GreedyToken(std::span<const float>(*rows).subspan(0, vocab));
  std::vector<int32_t> emitted = {row0};
  if (row0 == d1) emitted.push_back(GreedyToken(std::span<const float>(*rows).subspan(vocab)));
  drafter.Sync(1, plan.outputs[0].speculation);
  ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
  request.emitted = emitted;
  auto second = drafter.Propose(std::span<const Drafter::Request>(&request, 1));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ((*second)[0].size(), 1u);
  verified.insert(verified.end(), emitted.begin(), emitted.end());
  EXPECT_EQ((*second)[0][0], ReferenceDraft(verified));
}

}  // namespace
}  // namespace ringserve
