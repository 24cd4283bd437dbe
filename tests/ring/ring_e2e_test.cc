// The ring end to end: real stage and coordinator processes on loopback (CPU backend, tcp
// channel), driven through the gRPC Generate API, checked against transformers' golden tokens
// and the single-process reference.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/ring/reference.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

using ::testing::HasSubstr;
namespace v1 = ringserve::v1;

struct GoldenPrompt {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

std::vector<GoldenPrompt> LoadGolden(const std::string& arch) {
  std::ifstream in(FixtureModel(arch) + "/golden.json");
  nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<GoldenPrompt> out;
  if (golden.is_discarded()) return out;
  for (const auto& p : golden["prompts"]) {
    out.push_back({p["token_ids"].get<std::vector<int32_t>>(),
                   p["greedy_token_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

struct PartitionCase {
  std::string arch;
  std::vector<int> partition;
};

std::string CaseName(const ::testing::TestParamInfo<PartitionCase>& info) {
  std::string name = info.param.arch;
  std::replace(name.begin(), name.end(), '/', '_');
  for (int n : info.param.partition) name += "_" + std::to_string(n);
  return name;
}

class RingGoldenTest : public ::testing::TestWithParam<PartitionCase> {};

// The fixture's three prompts, run concurrently through the ring, give transformers' greedy
// continuation token for token.
TEST_P(RingGoldenTest, GreedyTokensMatchTransformers) {
  const PartitionCase& c = GetParam();
  std::vector<GoldenPrompt> golden = LoadGolden(c.arch);
  ASSERT_FALSE(golden.empty()) << "no golden.json for " << c.arch;
  auto ring = Ring::Start({.model_dir = FixtureModel(c.arch), .partition = c.partition});
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<v1::GenerateRequest> requests;
  for (const GoldenPrompt& g : golden) {
    requests.push_back(IdsRequest(g.prompt, static_cast<int>(g.greedy.size())));
  }
  std::vector<Generation> got = GenerateConcurrently(**ring, requests);
  for (size_t i = 0; i < golden.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message() << "\n"
                                    << (*ring)->CoordinatorLog();
    EXPECT_EQ(got[i].tokens, golden[i].greedy) << "prompt " << i;
    EXPECT_EQ(got[i].finish_reason, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(got[i].events, static_cast<int>(golden[i].greedy.size()));
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->stages_size(), static_cast<int>(c.partition.size()));
  for (const auto& stage : stats->stages()) {
    EXPECT_GT(stage.steps(), 0) << "stage " << stage.index();
    EXPECT_EQ(stage.micro_batches_in_flight(), 0);
    if (stage.index() + 1 < stats->stages_size()) {
      EXPECT_GT(stage.bytes_sent(), 0);
    }
  }
  EXPECT_EQ(stats->requests_finished(), static_cast<int64_t>(golden.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, RingGoldenTest,
    ::testing::Values(PartitionCase{"llama", {4}}, PartitionCase{"llama", {3, 1}},
                      PartitionCase{"llama", {2, 1, 1}}, PartitionCase{"llama", {1, 1, 1, 1}},
                      PartitionCase{"qwen3", {1, 2}}, PartitionCase{"qwen2", {2, 1}},
                      PartitionCase{"mistral", {1, 1, 1}}, PartitionCase{"deepseek_v3", {4}},
                      PartitionCase{"deepseek_v3", {1, 3}},
                      PartitionCase{"deepseek_v3", {1, 1, 1, 1}},
                      PartitionCase{"deepseek_v3_nolora", {2, 1}},
                      PartitionCase{"deepseek_v2", {1, 1, 1}},
                      // compressed-tensors int4 (group, asymmetric, actorder), dequantized by
                      // each stage at load.
                      PartitionCase{"quant/ct_int4", {1, 1}},
                      // Mixtures of experts: dense and MoE layers on different stages.
                      PartitionCase{"qwen3_moe", {3}}, PartitionCase{"qwen3_moe", {1, 1, 1}},
                      PartitionCase{"qwen2_moe", {1, 1, 1, 1}}, PartitionCase{"mixtral", {1, 1}},
                      PartitionCase{"glm4_moe", {1, 2}}, PartitionCase{"gpt_oss", {1, 1}}),
    CaseName);

// DeepSeek's MoE layers (first_k_dense_replace 1): the dense layer 0 and the MoE layers 1-2 on
// 1-3 stages, V3's grouped sigmoid router and V2's softmax greedy / group-limited routing.
INSTANTIATE_TEST_SUITE_P(DeepseekMoe, RingGoldenTest,
                         ::testing::Values(PartitionCase{"deepseek_v3_moe", {3}},
                                           PartitionCase{"deepseek_v3_moe", {1, 1, 1}},
                                           PartitionCase{"deepseek_v2_moe", {1, 2}},
                                           PartitionCase{"deepseek_v2_moe_group", {2, 1}}),
                         CaseName);

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int length, int vocab) {
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<int32_t> prompt(length);
  for (auto& t : prompt) t = token(rng);
  return prompt;
}

// 32 concurrent requests of mixed prompt and output lengths, through an uneven 3-stage ring
// with a small token budget (so long prompts are chunked and mixed with decodes): every one
// finishes with the reference's tokens, and the KV cache is empty afterwards.
TEST(RingE2ETest, ThirtyTwoConcurrentRequestsGetTheReferenceTokens) {
  const std::string model = FixtureModel("llama");
  auto reference = Reference::Load(model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto ring = Ring::Start({.model_dir = model,
                           .partition = {2, 1, 1},
                           .micro_batches_in_flight = 4,
                           .max_tokens_per_micro_batch = 48});
  ASSERT_TRUE(ring.ok()) << ring.status();
  const unsigned seed = 1234;
  std::mt19937 rng(seed);
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 32; ++i) {
    int length = std::uniform_int_distribution<int>(1, 90)(rng);
    int max_tokens = std::uniform_int_distribution<int>(1, 20)(rng);
    std::vector<int32_t> prompt = RandomPrompt(rng, length, (*reference)->config().vocab_size);
    auto want = (*reference)->Generate(prompt, max_tokens);
    ASSERT_TRUE(want.ok()) << want.status();
    expected.push_back(*want);
    requests.push_back(IdsRequest(prompt, max_tokens));
    requests.back().set_request_id("mixed-" + std::to_string(i));
  }
  std::vector<Generation> got = GenerateConcurrently(**ring, requests);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << "request " << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i << " (seed " << seed << ")";
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests_finished(), 32);
  EXPECT_EQ(stats->running(), 0);
  for (const auto& stage : stats->stages()) EXPECT_EQ(stage.kv_blocks_used(), 0);
  EXPECT_GT(stats->mean_ttft_ms(), 0);
}

// A seeded sampled request gives the same tokens whatever the partition and whatever else runs
// in the batch, and the same as the single-process reference with that seed.
TEST(RingE2ETest, SameSeedSameTokensAcrossPartitions) {
  const std::string model = FixtureModel("llama");
  auto reference = Reference::Load(model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  SamplingConfig config{.temperature = 1.0f, .top_k = 64, .top_p = 0.95f, .seed = 0};
  std::mt19937 rng(77);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> expected;
  bool differs_from_greedy = false;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(RandomPrompt(rng, 5 + 7 * i, (*reference)->config().vocab_size));
    config.seed = 1000 + i;
    auto want = (*reference)->Generate(prompts.back(), 12, config);
    auto greedy = (*reference)->Generate(prompts.back(), 12);
    ASSERT_TRUE(want.ok() && greedy.ok());
    differs_from_greedy = differs_from_greedy || *want != *greedy;
    expected.push_back(*want);
  }
  ASSERT_TRUE(differs_from_greedy) << "sampling must not collapse to greedy for this test";

  for (std::vector<int> partition : std::vector<std::vector<int>>{{4}, {1, 3}, {2, 1, 1}}) {
    auto ring = Ring::Start({.model_dir = model, .partition = partition});
    ASSERT_TRUE(ring.ok()) << ring.status();
    std::vector<v1::GenerateRequest> requests;
    for (int i = 0; i < 4; ++i) {
      requests.push_back(IdsRequest(prompts[i], 12));
      v1::SamplingParams* s = requests.back().mutable_sampling();
      s->set_temperature(config.temperature);
      s->set_top_k(config.top_k);
      s->set_top_p(config.top_p);
      s->set_seed(1000 + i);
    }
    // Unrelated greedy traffic in the same batches.
    for (int i = 0; i < 3; ++i) requests.push_back(IdsRequest(RandomPrompt(rng, 9, 512), 8));
    std::vector<Generation> got = GenerateConcurrently(**ring, requests);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected[i])
          << "request " << i << " with " << partition.size() << " stages";
    }
  }
}

// Cancelling a running request (the client goes away) frees its KV blocks; the ring keeps
// serving.
TEST(RingE2ETest, CancelledRequestFreesItsKvBlocks) {
  // Slow stages (10 ms a step) so the request is surely still running when it is cancelled.
  auto ring = Ring::Start(
      {.model_dir = FixtureModel("llama"), .partition = {2, 2}, .stage_step_delay_ms = 10});
  ASSERT_TRUE(ring.ok()) << ring.status();
  grpc::ClientContext context;
  v1::GenerateRequest request = IdsRequest({5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 200);
  auto reader = (*ring)->stub().Generate(&context, request);
  v1::GenerateResponse response;
  int events = 0;
  while (events < 3 && reader->Read(&response)) ++events;
  ASSERT_EQ(events, 3);
  auto during = (*ring)->Stats();
  ASSERT_TRUE(during.ok());
  EXPECT_GT(during->stages(0).kv_blocks_used(), 0);
  EXPECT_EQ(during->running(), 1);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // The server learns of the cancellation asynchronously: wait for it, bounded.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  v1::StatsResponse after;
  while (absl::Now() < deadline) {
    auto stats = (*ring)->Stats();
    ASSERT_TRUE(stats.ok());
    after = *stats;
    if (after.requests_cancelled() == 1 && after.running() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after.requests_cancelled(), 1);
  EXPECT_EQ(after.running(), 0);
  EXPECT_EQ(after.stages(0).kv_blocks_used(), 0);
  EXPECT_LT(after.generated_tokens(), 200);

  Generation next = (*ring)->Generate(IdsRequest({3, 4, 5}, 4));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens.size(), 4u);
}

// Requests that share a long prefix (a system prompt) reuse its KV blocks through the prefix
// cache, through a real 3-stage ring, and still get the reference's tokens.
TEST(RingE2ETest, SharedPrefixIsServedFromThePrefixCacheWithTheReferenceTokens) {
  const std::string model = FixtureModel("llama");
  auto reference = Reference::Load(model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto ring = Ring::Start({.model_dir = model, .partition = {2, 1, 1}});
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::mt19937 rng(77);
  const std::vector<int32_t> system = RandomPrompt(rng, 45, (*reference)->config().vocab_size);
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = system;
    std::vector<int32_t> own = RandomPrompt(rng, 1 + i, (*reference)->config().vocab_size);
    prompt.insert(prompt.end(), own.begin(), own.end());
    auto want = (*reference)->Generate(prompt, 8);
    ASSERT_TRUE(want.ok()) << want.status();
    expected.push_back(*want);
    requests.push_back(IdsRequest(prompt, 8));
    requests.back().set_request_id("shared-" + std::to_string(i));
  }
  // The first alone (it fills the cache), then the rest at once.
  Generation first = (*ring)->Generate(requests[0]);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, expected[0]);
  std::vector<v1::GenerateRequest> rest(requests.begin() + 1, requests.end());
  std::vector<Generation> got = GenerateConcurrently(**ring, rest);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, expected[i + 1]) << "request " << i + 1;
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok());
  // 7 later requests x the 2 full 16-token blocks of the 45-token system prompt.
  EXPECT_GE(stats->prefix_hit_tokens(), 7 * 32);
  for (const auto& stage : stats->stages()) EXPECT_EQ(stage.kv_blocks_used(), 0);
}

// A model directory with the qwen2 fixture's weights and the real Qwen3 tokenizer: its ids
// below 448 decode to real byte-level text, so stop strings can be tested on real text.
std::string FixtureWithTokenizer(const TempDir& dir) {
  std::string model = dir.path() + "/model";
  std::filesystem::create_directories(model);
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::create_symlink(FixtureModel("qwen2") + "/" + name, model + "/" + name);
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::create_symlink(SourceDir() + "/.deps/tokenizers/qwen3/" + name,
                                    model + "/" + name);
  }
  return model;
}

// Stop strings are matched on the detokenized text: the output ends right before the first
// match, with finish reason stop, and the stop string never reaches the client.
TEST(RingE2ETest, StopStringsAreMatchedOnTextAndNotLeaked) {
  TempDir dir;
  auto ring = Ring::Start({.model_dir = FixtureWithTokenizer(dir), .partition = {2, 1}});
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::vector<int32_t> prompt = {12, 345, 67, 89, 101, 202, 303, 404};
  Generation full = (*ring)->Generate(IdsRequest(prompt, 24));
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_GE(full.text.size(), 8u) << "'" << full.text << "'";

  // Two whole UTF-8 characters from the middle of the text.
  auto is_continuation = [&](size_t i) {
    return i < full.text.size() && (static_cast<unsigned char>(full.text[i]) & 0xC0) == 0x80;
  };
  size_t begin = full.text.size() / 2;
  while (begin > 0 && is_continuation(begin)) --begin;
  size_t end = begin;
  for (int chars = 0; chars < 2 && end < full.text.size(); ++chars) {
    ++end;
    while (is_continuation(end)) ++end;
  }
  const std::string stop = full.text.substr(begin, end - begin);
  const std::string expected = full.text.substr(0, full.text.find(stop));
  v1::GenerateRequest request = IdsRequest(prompt, 24);
  request.mutable_sampling()->add_stop(stop);
  request.mutable_sampling()->add_stop("a stop string that never appears");
  Generation cut = (*ring)->Generate(request);
  ASSERT_TRUE(cut.status.ok()) << cut.status.error_message();
  EXPECT_EQ(cut.text, expected) << "stop '" << stop << "' in '" << full.text << "'";
  EXPECT_EQ(cut.finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_LT(cut.tokens.size(), full.tokens.size());

  // A text prompt is tokenized by the coordinator; ids outside this tiny model's vocabulary
  // are refused up front, naming the position.
  v1::GenerateRequest text = IdsRequest({}, 4);
  text.set_text("Hello, world");
  Generation refused = (*ring)->Generate(text);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("outside the vocabulary"));
}

// A hosts.yaml with overlapping layers is refused with a message naming the field.
TEST(RingE2ETest, BadHostsYamlFailsWithItsMessage) {
  TempDir dir;
  std::string path = dir.path() + "/hosts.yaml";
  std::ofstream(path) << "model: " << FixtureModel("llama") << "\n"
                      << "stages:\n"
                      << "  - {host: 127.0.0.1, port: 7001, layers: [0, 3]}\n"
                      << "  - {host: 127.0.0.1, port: 7002, layers: [2, 4]}\n";
  auto result = RunCoordinatorToExit({"--stages", path}, absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0);
  EXPECT_THAT(result->stderr_text, HasSubstr("stages[1].layers"));
  EXPECT_THAT(result->stderr_text, HasSubstr("overlap"));
  EXPECT_THAT(result->stderr_text, HasSubstr(path));
}

// A stage that nobody runs fails start-up within the bounded wait, naming its endpoint.
TEST(RingE2ETest, UnreachableStageFailsWithinTheBoundedWait) {
  TempDir dir;
  std::string path = dir.path() + "/hosts.yaml";
  // Port 9 (discard) on loopback: nothing listens there in a test environment.
  std::ofstream(path) << "model: " << FixtureModel("llama") << "\n"
                      << "stages:\n"
                      << "  - {host: 127.0.0.1, port: 9, layers: 4}\n";
  auto result =
      RunCoordinatorToExit({"--stages", path, "--connect_timeout", "1"}, absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0);
  EXPECT_THAT(result->stderr_text, HasSubstr("127.0.0.1:9"));
  EXPECT_THAT(result->stderr_text, HasSubstr("not reachable within 1s"));
  EXPECT_LT(result->seconds, 10);
}

// A GPU channel between CPU stages is refused before anything starts, naming the channel.
TEST(RingE2ETest, GpuChannelBetweenCpuStagesIsRefused) {
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {2, 2},
                           .device = "cpu",
                           .channel = "cuda_ipc"});
  ASSERT_FALSE(ring.ok());
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("cuda_ipc"));
}

// A CUDA stage on a machine without a GPU fails its configuration with a message that says so;
// the coordinator exits instead of hanging. (Skipped where a GPU is present.)
TEST(RingE2ETest, CudaStageWithoutAGpuFailsClearly) {
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {2, 2},
                           .device = "cuda:0",
                           .channel = "cuda_ipc"});
  if (ring.ok()) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("no CUDA device 0"));
}

}  // namespace
}  // namespace ringserve::testing
