// The device MTP drafter's bookkeeping (what a CUDA last stage runs, device_mtp_drafter.h) on a
// CPU stand-in for the device (the CPU slice's final hidden rows and its CpuMtpLayer behind
// MtpDevice, small batch limits): a prompt prefilled in two chunks (the first one's pairs fed
// right after the target's pass, its last row kept in the store), then verification steps; the
// drafts equal those of the layer fed every verified pair at once from a fresh target
// (DeepSeek-V3 fixture with a dense MTP layer). A sequence whose earlier positions the stage
// never saw gets no drafts.
#include "stage/speculative/device_mtp_drafter.h"

#include <gtest/gtest.h>

#include "common/status_macros.h"
#include "kernels/cpu/ops.h"
#include "stage/model/cpu_model_slice.h"
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

// The CPU slice as an MtpDevice: rows are model.norm of its last Forward's activations.
class CpuMtpDevice : public MtpDevice {
 public:
  explicit CpuMtpDevice(CpuModelSlice* slice)
      : slice_(slice),
        hidden_(slice->config().hidden_size),
        store_(static_cast<size_t>(kStoreRows) * hidden_) {}
  static constexpr int kStoreRows = 40;

  const ModelSlice& target() const override { return *slice_; }
  int store_rows() const override { return kStoreRows; }
  Limits limits() const override { return {.max_tokens = 6, .max_chunks = 2, .max_logit_rows = 2}; }
  absl::Status StoreHidden(int run_row, int count, int store_row) override {
    for (int i = 0; i < count; ++i) {
      const std::vector<float> h = RunRow(run_row + i);
      std::copy(h.begin(), h.end(), store_.begin() + (store_row + i) * hidden_);
    }
    ++stores;
    return absl::OkStatus();
  }
  absl::StatusOr<int> Run(const MicroBatch& batch, std::span<const int32_t> rows,
                          Source source) override {
    EXPECT_LE(batch.TotalTokens(), limits().max_tokens);
    EXPECT_LE(static_cast<int>(batch.chunks.size()), limits().max_chunks);
    std::vector<float> hidden;
    for (int32_t r : rows) {
      if (source == Source::kStore) {
        hidden.insert(hidden.end(), store_.begin() + r * hidden_,
                      store_.begin() + (r + 1) * hidden_);
      } else {
        const std::vector<float> h = RunRow(r);
        hidden.insert(hidden.end(), h.begin(), h.end());
      }
    }
    RS_ASSIGN_OR_RETURN(logits_, slice_->mtp()->Forward(batch, hidden));
    ++runs;
    return static_cast<int>(logits_.size() / slice_->config().vocab_size);
  }
  absl::StatusOr<Outputs> Results(int rows, std::span<const int> to_host) override {
    const size_t vocab = static_cast<size_t>(slice_->config().vocab_size);
    Outputs out;
    for (int r = 0; r < rows; ++r) {
      out.argmax.push_back(GreedyToken(std::span<const float>(logits_).subspan(r * vocab, vocab)));
    }
    for (int r : to_host) {
      out.logits.insert(out.logits.end(), logits_.begin() + r * vocab,
                        logits_.begin() + (r + 1) * vocab);
    }
    return out;
  }

  int runs = 0;
  int stores = 0;

 private:
  std::vector<float> RunRow(int row) const {
    std::vector<float> h(hidden_);
    cpu::RmsNorm(slice_->activations().data() + row * hidden_, slice_->final_norm().data(), 1,
                 hidden_, slice_->config().rms_norm_eps, h.data());
    return h;
  }

  CpuModelSlice* slice_;
  int64_t hidden_;
  std::vector<float> store_;
  std::vector<float> logits_;
};

MicroBatch Chunk(uint64_t seq, int32_t start, std::vector<int32_t> ids, LogitsMode logits) {
  MicroBatch batch;
  batch.chunks.push_back(SequenceChunk{.seq_id = seq,
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
      Chunk(1, 0, std::vector<int32_t>(tokens.begin(), tokens.end() - 1), LogitsMode::kLastToken);
  EXPECT_TRUE(target->Forward(all, {}).ok());
  const int64_t hidden = target->config().hidden_size;
  const int64_t rows = all.TotalTokens();
  std::vector<float> h(rows * hidden);
  cpu::RmsNorm(target->activations().data(), target->final_norm().data(), rows, hidden,
               target->config().rms_norm_eps, h.data());
  MicroBatch pairs =
      Chunk(1, 0, std::vector<int32_t>(tokens.begin() + 1, tokens.end()), LogitsMode::kLastToken);
  auto logits = target->mtp()->Forward(pairs, h);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? GreedyToken(*logits) : -1;
}

// The target's greedy token after `tokens`, from a fresh target (a draft that will be accepted).
int32_t TargetNext(const std::vector<int32_t>& tokens) {
  std::unique_ptr<CpuModelSlice> target = Load();
  auto logits = target->Forward(Chunk(1, 0, tokens, LogitsMode::kLastToken), {});
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? GreedyToken(*logits) : -1;
}

TEST(DeviceMtpDrafterTest, ChunkedPrefillAndVerificationsDraftAsTheLayerFedAtOnce) {
  std::unique_ptr<CpuModelSlice> target = Load();
  ASSERT_NE(target, nullptr);
  ASSERT_NE(target->mtp(), nullptr);
  auto owned = std::make_unique<CpuMtpDevice>(target.get());
  CpuMtpDevice* device = owned.get();
  DeviceMtpDrafter drafter(std::move(owned));
  const size_t vocab = static_cast<size_t>(target->config().vocab_size);
  const std::vector<int32_t> prompt = {5, 17, 42, 9, 100, 23, 64, 7, 81, 33};

  // The prompt's first chunk: samples nothing; pairs 0..4 fed at once, row 5 kept.
  DecodedPlan plan;
  plan.batch =
      Chunk(1, 0, std::vector<int32_t>(prompt.begin(), prompt.begin() + 6), LogitsMode::kNone);
  plan.outputs = {ChunkOutput{
      .samples = false,
      .speculation = {.active = true,
                      .context_ids = std::vector<int32_t>(prompt.begin(), prompt.begin() + 6)}}};
  ASSERT_TRUE(target->Forward(plan.batch, {}).ok());
  drafter.Sync(1, plan.outputs[0].speculation);
  ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
  EXPECT_EQ(device->runs, 1);
  EXPECT_EQ(device->stores, 1);

  // The second chunk samples t; the drafter drafts d1.
  plan.batch =
      Chunk(1, 6, std::vector<int32_t>(prompt.begin() + 6, prompt.end()), LogitsMode::kLastToken);
  plan.outputs = {ChunkOutput{
      .samples = true,
      .speculation = {.active = true,
                      .context_start = 6,
                      .context_ids = std::vector<int32_t>(prompt.begin() + 6, prompt.end()),
                      .propose = 1}}};
  auto logits = target->Forward(plan.batch, {});
  ASSERT_TRUE(logits.ok());
  int32_t t = GreedyToken(*logits);
  drafter.Sync(1, plan.outputs[0].speculation);
  ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
  Drafter::Request request{.seq_id = 1, .emitted = {t}, .k = 1};
  auto drafts = drafter.Propose(std::span<const Drafter::Request>(&request, 1));
  ASSERT_TRUE(drafts.ok()) << drafts.status();
  ASSERT_EQ((*drafts)[0].size(), 1u);
  std::vector<int32_t> verified = prompt;
  verified.push_back(t);
  EXPECT_EQ((*drafts)[0][0], ReferenceDraft(verified));
  EXPECT_EQ(drafter.LastDrafts(1).size(), 1u);
  EXPECT_TRUE(drafter.DraftProbabilities(1).empty());  // greedy

  // Verification steps [last, draft]; greedy verification emits what the target says. Odd steps
  // verify the target's own next token instead of the drafter's draft (accepted: two pairs fed),
  // even ones the drafter's (the random-weight layer's drafts are mostly rejected).
  int accepted = 0;
  int32_t synced = static_cast<int32_t>(prompt.size());
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "verification " << step);
    const int32_t d = step % 2 == 1 ? TargetNext(verified) : (*drafts)[0][0];
    const int32_t start = static_cast<int32_t>(verified.size()) - 1;
    plan.batch = Chunk(1, start, {verified.back(), d}, LogitsMode::kAllTokens);
    // The coordinator's context: the verified tokens since the last sync.
    plan.outputs = {ChunkOutput{.samples = true,
                                .speculation = {.active = true,
                                                .context_start = synced,
                                                .context_ids = std::vector<int32_t>(
                                                    verified.begin() + synced, verified.end()),
                                                .draft_ids = {d},
                                                .propose = 1}}};
    synced = static_cast<int32_t>(verified.size());
    auto rows = target->Forward(plan.batch, {});
    ASSERT_TRUE(rows.ok());
    const int32_t row0 = GreedyToken(std::span<const float>(*rows).subspan(0, vocab));
    std::vector<int32_t> emitted = {row0};
    if (row0 == d) {
      emitted.push_back(GreedyToken(std::span<const float>(*rows).subspan(vocab)));
      ++accepted;
    }
    drafter.Sync(1, plan.outputs[0].speculation);
    ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
    request.emitted = emitted;
    drafts = drafter.Propose(std::span<const Drafter::Request>(&request, 1));
    ASSERT_TRUE(drafts.ok()) << drafts.status();
    ASSERT_EQ((*drafts)[0].size(), 1u);
    verified.insert(verified.end(), emitted.begin(), emitted.end());
    EXPECT_EQ((*drafts)[0][0], ReferenceDraft(verified));
  }
  EXPECT_GE(accepted, 3);
}

TEST(DeviceMtpDrafterTest, UnseenPrefixPositionsGetNoDrafts) {
  std::unique_ptr<CpuModelSlice> target = Load();
  ASSERT_NE(target, nullptr);
  DeviceMtpDrafter drafter(std::make_unique<CpuMtpDevice>(target.get()));
  // The sequence's context starts at 4: positions 0..3 came from the prefix cache.
  DecodedPlan plan;
  plan.batch = Chunk(2, 4, {9, 100, 23}, LogitsMode::kLastToken);
  plan.outputs = {ChunkOutput{
      .samples = true,
      .speculation = {
          .active = true, .context_start = 4, .context_ids = {9, 100, 23}, .propose = 1}}};
  ASSERT_TRUE(target->Forward(plan.batch, {}).ok());
  drafter.Sync(2, plan.outputs[0].speculation);
  ASSERT_TRUE(drafter.ObserveTarget(*target, plan).ok());
  Drafter::Request request{.seq_id = 2, .emitted = {7}, .k = 1};
  auto drafts = drafter.Propose(std::span<const Drafter::Request>(&request, 1));
  ASSERT_TRUE(drafts.ok()) << drafts.status();
  EXPECT_TRUE((*drafts)[0].empty());
}

}  // namespace
}  // namespace ringserve
