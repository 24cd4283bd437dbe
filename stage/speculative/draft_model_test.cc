// The draft model on the last stage (the trained models/ringserve-tiny-draft on the CPU):
// drafts after a rollback equal those of a draft model that saw only the verified tokens, and
// the speculator's greedy verification emits what plain greedy decoding of the target would.
#include "stage/speculative/draft_model.h"

#include <gtest/gtest.h>

#include "stage/async_cpu_slice_testing.h"
#include "stage/sampling/sampler.h"
#include "stage/speculative/speculator.h"

namespace ringserve {
namespace {

constexpr char kTarget[] = "models/ringserve-tiny";
constexpr char kDraft[] = "models/ringserve-tiny-draft";
// "Once upon a time" in the trained tokenizer's ids would do; any ids exercise the cache.
const std::vector<int32_t> kPrompt = {0, 412, 301, 97, 1203, 15, 88, 640, 23};

std::unique_ptr<ModelSlice> LoadWhole(const std::string& dir, int layers) {
  auto slice = ModelSlice::LoadCpu(
      {.model_dir = dir, .layers = {0, layers}, .kv_block_size = 4, .kv_num_blocks = 64});
  EXPECT_TRUE(slice.ok()) << slice.status();
  return slice.ok() ? *std::move(slice) : nullptr;
}

ChunkSpeculationWire Context(int32_t start, std::vector<int32_t> ids) {
  return ChunkSpeculationWire{.active = true, .context_start = start, .context_ids = ids};
}

std::vector<int32_t> ProposeOne(DraftModel& draft, uint64_t seq, std::vector<int32_t> emitted,
                                int k) {
  DraftModel::Request request{.seq_id = seq, .emitted = std::move(emitted), .k = k};
  auto drafts = draft.Propose(std::span<const DraftModel::Request>(&request, 1));
  EXPECT_TRUE(drafts.ok()) << drafts.status();
  return drafts.ok() ? (*drafts)[0] : std::vector<int32_t>{};
}

TEST(DraftModelTest, DraftsAfterARollbackEqualAFreshDraft) {
  DraftModel draft(LoadWhole(kDraft, 2), /*max_batch_tokens=*/4);  // the prompt in pieces
  draft.Sync(1, Context(0, kPrompt));
  const std::vector<int32_t> first = ProposeOne(draft, 1, {77}, 4);
  ASSERT_EQ(first.size(), 4u);
  // The target accepted the first draft, then emitted 5 (not the second draft).
  const int32_t other = first[1] == 5 ? 6 : 5;
  draft.Sync(1, Context(static_cast<int32_t>(kPrompt.size()), {77}));
  const std::vector<int32_t> second = ProposeOne(draft, 1, {first[0], other}, 3);

  std::vector<int32_t> verified = kPrompt;
  verified.insert(verified.end(), {77, first[0]});
  DraftModel fresh(LoadWhole(kDraft, 2), 64);
  fresh.Sync(7, Context(0, verified));
  EXPECT_EQ(second, ProposeOne(fresh, 7, {other}, 3));
  EXPECT_EQ(draft.num_sequences(), 1);
  const int free_before = draft.free_blocks();
  draft.Release(1);
  EXPECT_GT(draft.free_blocks(), free_before);
  EXPECT_EQ(draft.num_sequences(), 0);
}

// Greedy drafting on a slice that samples "on the device" (each round fed the previous round's
// argmax there, ProposeFed) drafts what drafting round by round through the host does: two
// sequences with different k, a prompt fed in one piece, then rollbacks.
TEST(DraftModelTest, DraftsFedOnTheDeviceEqualDraftsThroughTheHost) {
  auto async_slice = std::make_unique<testing::AsyncCpuSlice>(LoadWhole(kDraft, 2));
  testing::AsyncCpuSlice* device = async_slice.get();
  DraftModel fed(std::move(async_slice), 64);
  DraftModel host(LoadWhole(kDraft, 2), 64);
  const std::vector<int32_t> other_prompt = {0, 97, 15, 640};
  for (DraftModel* draft : {&fed, &host}) {
    draft->Sync(1, Context(0, kPrompt));
    draft->Sync(2, Context(0, other_prompt));
  }
  auto propose = [](DraftModel& draft, std::vector<DraftModel::Request> requests) {
    auto drafts = draft.Propose(requests);
    EXPECT_TRUE(drafts.ok()) << drafts.status();
    return drafts.ok() ? *drafts : std::vector<std::vector<int32_t>>{};
  };
  std::vector<DraftModel::Request> requests = {{.seq_id = 1, .emitted = {77}, .k = 4},
                                               {.seq_id = 2, .emitted = {5}, .k = 2}};
  const auto first = propose(fed, requests);
  ASSERT_EQ(first, propose(host, requests));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(first[0].size(), 4u);
  ASSERT_EQ(first[1].size(), 2u);
  EXPECT_GT(device->fed_tokens, 0);  // rounds after the first were fed on the "device"
  // Sequence 1 accepted one draft then got another token; sequence 2 accepted both drafts.
  const int32_t other = first[0][1] == 5 ? 6 : 5;
  const int32_t seq1_told = static_cast<int32_t>(kPrompt.size());
  const int32_t seq2_told = static_cast<int32_t>(other_prompt.size());
  for (DraftModel* draft : {&fed, &host}) {
    draft->Sync(1, Context(seq1_told, {77}));
    draft->Sync(2, Context(seq2_told, {5}));
  }
  requests = {{.seq_id = 1, .emitted = {first[0][0], other}, .k = 3},
              {.seq_id = 2, .emitted = {first[1][0], first[1][1], 9}, .k = 4}};
  const auto second = propose(fed, requests);
  EXPECT_EQ(second, propose(host, requests));
  EXPECT_EQ(second[0].size(), 3u);
  EXPECT_EQ(second[1].size(), 4u);
}

TEST(DraftModelTest, AContextPastWhatItKnowsGivesNoDrafts) {
  DraftModel draft(LoadWhole(kDraft, 2), 64);
  draft.Sync(3, Context(5, {1, 2}));  // it never saw positions 0..4
  EXPECT_TRUE(ProposeOne(draft, 3, {9}, 4).empty());
}

// Greedy verification on the last stage: the emitted tokens (accepted drafts + the correction
// or bonus) equal plain greedy decoding of the target.
TEST(SpeculatorTest, GreedyVerificationEmitsPlainGreedyTokens) {
  std::unique_ptr<ModelSlice> target = LoadWhole(kTarget, 8);
  std::unique_ptr<ModelSlice> plain = LoadWhole(kTarget, 8);
  ASSERT_NE(target, nullptr);
  Speculator speculator(std::make_unique<DraftModel>(LoadWhole(kDraft, 2), 64), 4);
  auto chunk = [](int32_t start, std::vector<int32_t> ids, LogitsMode logits) {
    MicroBatch batch;
    batch.chunks.push_back(SequenceChunk{.seq_id = 1,
                                         .start_position = start,
                                         .num_tokens = static_cast<int32_t>(ids.size()),
                                         .block_table = {0, 1, 2, 3, 4, 5, 6, 7},
                                         .logits = logits});
    batch.token_ids = std::move(ids);
    return batch;
  };
  // Plain greedy reference: 12 tokens after the prompt.
  std::vector<int32_t> reference;
  {
    auto logits = plain->Forward(chunk(0, kPrompt, LogitsMode::kLastToken), {});
    ASSERT_TRUE(logits.ok());
    reference.push_back(GreedyToken(*logits));
    while (reference.size() < 12) {
      auto next = plain->Forward(chunk(static_cast<int32_t>(kPrompt.size() + reference.size() - 1),
                                       {reference.back()}, LogitsMode::kLastToken),
                                 {});
      ASSERT_TRUE(next.ok());
      reference.push_back(GreedyToken(*next));
    }
  }
  // Speculative: the prompt, then verification chunks of the drafts.
  std::vector<int32_t> emitted;
  DecodedPlan plan;
  plan.batch = chunk(0, kPrompt, LogitsMode::kLastToken);
  plan.sampling = {RowSampling{}};
  plan.outputs = {ChunkOutput{.samples = true, .speculation = Context(0, kPrompt)}};
  plan.outputs[0].speculation.propose = 4;
  int told = static_cast<int>(kPrompt.size());
  int verified_drafts = 0;
  while (emitted.size() < 12) {
    ASSERT_TRUE(target->Prepare(plan.batch).ok());
    ASSERT_TRUE(target->Run(plan.batch).ok());
    std::vector<v1::SampledToken> tokens;
    std::vector<v1::PromptLogprobs> scores;
    ASSERT_TRUE(speculator.SampleInto(*target, plan, &tokens, &scores).ok());
    ASSERT_EQ(tokens.size(), 1u);
    ASSERT_EQ(tokens[0].accepted_logprobs_size(), tokens[0].accepted_ids_size());
    for (float logprob : tokens[0].accepted_logprobs()) EXPECT_LE(logprob, 0.0f);
    emitted.insert(emitted.end(), tokens[0].accepted_ids().begin(), tokens[0].accepted_ids().end());
    emitted.push_back(tokens[0].token_id());
    std::vector<int32_t> drafts(tokens[0].draft_ids().begin(), tokens[0].draft_ids().end());
    ASSERT_FALSE(drafts.empty());
    verified_drafts += static_cast<int>(drafts.size());
    // Next: [last emitted, drafts...] at the last emitted token's position.
    const int32_t start = static_cast<int32_t>(kPrompt.size() + emitted.size() - 1);
    std::vector<int32_t> ids = {emitted.back()};
    ids.insert(ids.end(), drafts.begin(), drafts.end());
    plan.batch = chunk(start, ids, LogitsMode::kAllTokens);
    plan.sampling = {RowSampling{.config = SamplingConfig{}, .token_index = emitted.size()}};
    std::vector<int32_t> context(emitted.begin() + (told - static_cast<int>(kPrompt.size())),
                                 emitted.end());
    plan.outputs = {ChunkOutput{.samples = true,
                                .speculation = {.active = true,
                                                .context_start = told,
                                                .context_ids = context,
                                                .draft_ids = drafts,
                                                .propose = 4}}};
    told = start + 1;
  }
  emitted.resize(12);
  EXPECT_EQ(emitted, reference);
  EXPECT_GT(speculator.stats().drafts_accepted, 0);
  EXPECT_GT(verified_drafts, 0);
}

// Sampled drafts this stage did not propose (its state was lost) cannot be verified: the chunk
// emits a plain sample of its first row, as decoding without drafts would.
TEST(SpeculatorTest, UnknownSampledDraftsFallBackToAPlainSample) {
  std::unique_ptr<ModelSlice> target = LoadWhole(kTarget, 8);
  ASSERT_NE(target, nullptr);
  Speculator speculator(std::make_unique<DraftModel>(LoadWhole(kDraft, 2), 64), 4);
  DecodedPlan plan;
  plan.batch.chunks.push_back(SequenceChunk{.seq_id = 4,
                                            .start_position = 0,
                                            .num_tokens = 3,
                                            .block_table = {0},
                                            .logits = LogitsMode::kAllTokens});
  plan.batch.token_ids = {0, 412, 301};
  const RowSampling row{.config = SamplingConfig{.temperature = 1.0f, .seed = 3}, .token_index = 0};
  plan.sampling = {row};
  plan.outputs = {ChunkOutput{
      .samples = true,
      .speculation = {
          .active = true, .context_start = 0, .context_ids = {0}, .draft_ids = {412, 301}}}};
  ASSERT_TRUE(target->Prepare(plan.batch).ok());
  ASSERT_TRUE(target->Run(plan.batch).ok());
  auto logits = target->LogitsToHost();
  ASSERT_TRUE(logits.ok());
  std::vector<v1::SampledToken> tokens;
  std::vector<v1::PromptLogprobs> scores;
  ASSERT_TRUE(speculator.SampleInto(*target, plan, &tokens, &scores).ok());
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(tokens[0].accepted_ids_size(), 0);
  const size_t vocab = static_cast<size_t>(target->config().vocab_size);
  EXPECT_EQ(tokens[0].token_id(),
            SampleRow(std::span<const float>(*logits).subspan(0, vocab), row));
  EXPECT_TRUE(scores.empty());
}

}  // namespace
}  // namespace ringserve
