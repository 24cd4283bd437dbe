// LaunchSampleRows against the CPU sampler (stage/sampling/sampler.h) on fresh random logits:
// the same token on every row and the same logprob (1e-4), for vocab 151936 and 1000, mixed
// parameters (greedy, temperatures, top-k, top-p, seeds, token indices) and edge rows (ties,
// NaN, -inf, +inf, all -inf, constant rows, -0.0, top-k beyond the candidates).
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/sampling/sampler.h"

namespace ringserve::cuda {
namespace {

using testing::Download;
using testing::Poison;
using testing::Upload;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kLogprobTol = 1e-4;

struct GpuResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

GpuResult RunGpu(const std::vector<float>& logits, int vocab,
                 const std::vector<GpuRowSampling>& params) {
  const int rows = static_cast<int>(params.size());
  DeviceBuffer d_logits = Upload(logits);
  DeviceBuffer d_params = Upload(params);
  DeviceBuffer d_tokens, d_logprobs, d_workspace;
  EXPECT_TRUE(d_tokens.Allocate(rows * sizeof(int32_t)).ok());
  EXPECT_TRUE(d_logprobs.Allocate(rows * sizeof(float)).ok());
  const size_t workspace_bytes = SampleRowsWorkspaceBytes(rows, vocab);
  EXPECT_TRUE(d_workspace.Allocate(workspace_bytes).ok());
  Poison(d_tokens);
  Poison(d_logprobs);
  const absl::Status status = LaunchSampleRows(
      d_logits.as<float>(), rows, vocab, d_params.as<GpuRowSampling>(), d_tokens.as<int32_t>(),
      d_logprobs.as<float>(), d_workspace.get(), workspace_bytes, nullptr);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {Download<int32_t>(d_tokens, rows), Download<float>(d_logprobs, rows)};
}

RowSampling ToCpu(const GpuRowSampling& p) {
  RowSampling row;
  row.config.temperature = p.temperature;
  row.config.top_k = p.top_k;
  row.config.top_p = p.top_p;
  row.config.seed = p.seed;
  row.token_index = p.token_index;
  return row;
}

std::span<const float> Row(const std::vector<float>& logits, int vocab, int r) {
  return {logits.data() + static_cast<size_t>(r) * vocab, static_cast<size_t>(vocab)};
}

// Checks every row against SampleRow / TokenLogprob; returns how many rows drew a token other
// than the argmax (so a test can insist that sampling really happened).
int ExpectMatchesCpu(const std::vector<float>& logits, int vocab,
                     const std::vector<GpuRowSampling>& params, const GpuResult& got) {
  int not_greedy = 0;
  for (size_t r = 0; r < params.size(); ++r) {
    const GpuRowSampling& p = params[r];
    SCOPED_TRACE(::testing::Message()
                 << "vocab " << vocab << " row " << r << " temperature " << p.temperature
                 << " top_k " << p.top_k << " top_p " << p.top_p << " seed " << p.seed
                 << " token_index " << p.token_index);
    const auto row = Row(logits, vocab, static_cast<int>(r));
    const int32_t want = SampleRow(row, ToCpu(p));
    EXPECT_EQ(got.tokens[r], want);
    const float want_logprob = TokenLogprob(row, want);
    if (std::isinf(want_logprob)) {
      EXPECT_EQ(got.logprobs[r], want_logprob);
    } else {
      EXPECT_NEAR(got.logprobs[r], want_logprob, kLogprobTol);
    }
    if (want != GreedyToken(row)) ++not_greedy;
  }
  return not_greedy;
}

GpuRowSampling Params(float temperature, int top_k, float top_p, std::mt19937_64& rng) {
  return {temperature, top_k, top_p, rng(), rng() % 4096};
}

// 64 rows: 48 covering every (temperature, top_k, top_p) combination on random logits of
// varying spread (some bf16-rounded, so full of ties), then 16 edge rows.
void MakeMixedRows(int vocab, std::mt19937_64& rng, std::vector<float>* logits,
                   std::vector<GpuRowSampling>* params) {
  constexpr int kRows = 64;
  const float temperatures[] = {0.0f, 0.7f, 1.0f, 1.5f};
  const int top_ks[] = {0, 1, 20, 50};
  const float top_ps[] = {1.0f, 0.9f, 0.5f};
  const float scales[] = {0.5f, 2.0f, 6.0f};
  logits->assign(static_cast<size_t>(kRows) * vocab, 0.0f);
  params->clear();
  for (int r = 0; r < kRows; ++r) {
    std::normal_distribution<float> dist(0.0f, scales[r % 3]);
    const bool bf16 = (r % 5) % 2 == 0;
    float* row = logits->data() + static_cast<size_t>(r) * vocab;
    for (int i = 0; i < vocab; ++i) {
      row[i] = bf16 ? BF16ToFloat(FloatToBF16(dist(rng))) : dist(rng);
    }
    if (r < 48) {
      params->push_back(Params(temperatures[r % 4], top_ks[(r / 4) % 4], top_ps[r / 16], rng));
    }
  }
  auto row = [&](int r) { return logits->data() + static_cast<size_t>(r) * vocab; };
  auto fill = [&](int r, float value) { std::fill_n(row(r), vocab, value); };
  // 48: greedy, tie at the maximum -> lowest id.
  row(48)[vocab - 3] = 100.0f;
  row(48)[5] = 100.0f;
  params->push_back(Params(0.0f, 0, 1.0f, rng));
  // 49: the top-k boundary inside a tie group: keeps 3, 10, 20 (not 30, 40).
  row(49)[3] = 60.0f;
  for (int id : {40, 30, 20, 10}) row(49)[id] = 50.0f;
  params->push_back(Params(10.0f, 3, 1.0f, rng));
  // 50: NaN and -inf scattered.
  for (int i = 0; i < vocab; i += 7) row(50)[i] = kNaN;
  for (int i = 3; i < vocab; i += 11) row(50)[i] = -kInf;
  params->push_back(Params(1.0f, 0, 1.0f, rng));
  // 51: all -inf; 52: all NaN -> token 0.
  fill(51, -kInf);
  params->push_back(Params(1.0f, 0, 1.0f, rng));
  fill(52, kNaN);
  params->push_back(Params(0.7f, 20, 0.9f, rng));
  // 53: one finite logit.
  fill(53, -kInf);
  row(53)[vocab - 1] = -3.0f;
  params->push_back(Params(1.5f, 0, 0.9f, rng));
  // 54: +inf logits: the first one wins.
  row(54)[17] = kInf;
  row(54)[4] = kInf;
  params->push_back(Params(1.0f, 0, 1.0f, rng));
  // 55: top-k beyond any small candidate buffer; 56: top-k >= vocab (off).
  params->push_back(Params(1.0f, 5000, 1.0f, rng));
  params->push_back(Params(1.0f, vocab + 5, 0.9f, rng));
  // 57: top-k larger than the 5 candidates: off, so the inverse CDF runs in id order.
  fill(57, -kInf);
  for (int id : {0, 1, 100, 500, vocab - 1}) row(57)[id] = static_cast<float>(id % 3);
  params->push_back(Params(1.0f, 10, 1.0f, rng));
  // 58: tiny top-p keeps only the first maximum.
  row(58)[9] = 80.0f;
  row(58)[2] = 80.0f;
  params->push_back(Params(1.0f, 0, 1e-6f, rng));
  // 59: very low temperature.
  params->push_back(Params(0.05f, 0, 1.0f, rng));
  // 60: constant row with -0.0 and +0.0 (ties by id); 61: constant row with top-k.
  for (int i = 0; i < vocab; ++i) row(60)[i] = i % 2 ? -0.0f : 0.0f;
  params->push_back(Params(1.0f, 0, 0.5f, rng));
  fill(61, 1.25f);
  params->push_back(Params(1.0f, 7, 1.0f, rng));
  // 62: large logits.
  for (int i = 0; i < vocab; ++i) row(62)[i] *= 5.0f;
  params->push_back(Params(1.0f, 0, 0.9f, rng));
  // 63: both cuts, extreme seed and token index.
  params->push_back({1.0f, 50, 0.9f, ~0ull, ~0ull});
}

TEST(CudaSampleRowsTest, MatchesCpuSamplerOnMixedRowsAndEdgeCases) {
  RS_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int vocab : {151936, 1000}) {
    std::vector<float> logits;
    std::vector<GpuRowSampling> params;
    MakeMixedRows(vocab, rng, &logits, &params);
    const GpuResult got = RunGpu(logits, vocab, params);
    ASSERT_EQ(got.tokens.size(), params.size());
    const int not_greedy = ExpectMatchesCpu(logits, vocab, params, got);
    EXPECT_GE(not_greedy, 10) << "vocab " << vocab;
    EXPECT_EQ(got.tokens[48], 5);
    EXPECT_TRUE(got.tokens[49] == 3 || got.tokens[49] == 10 || got.tokens[49] == 20)
        << got.tokens[49];
    EXPECT_EQ(got.tokens[51], 0);
    EXPECT_EQ(got.logprobs[51], 0.0f);
    EXPECT_EQ(got.tokens[52], 0);
    EXPECT_EQ(got.tokens[53], vocab - 1);
    EXPECT_EQ(got.logprobs[53], 0.0f);
    EXPECT_EQ(got.tokens[54], 4);
    EXPECT_EQ(got.tokens[58], 2);
    EXPECT_LT(got.tokens[60], vocab / 2 + 1);
  }
}

TEST(CudaSampleRowsTest, RowResultsDoNotDependOnBatchOrReruns) {
  RS_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int vocab = 151936;
  std::vector<float> logits;
  std::vector<GpuRowSampling> params;
  MakeMixedRows(vocab, rng, &logits, &params);
  const int rows = static_cast<int>(params.size());
  const GpuResult first = RunGpu(logits, vocab, params);
  const GpuResult again = RunGpu(logits, vocab, params);
  // The same rows in reverse order.
  std::vector<float> reversed_logits(logits.size());
  std::vector<GpuRowSampling> reversed_params(params.rbegin(), params.rend());
  for (int r = 0; r < rows; ++r) {
    const auto row = Row(logits, vocab, r);
    std::copy(row.begin(), row.end(),
              reversed_logits.begin() + static_cast<size_t>(rows - 1 - r) * vocab);
  }
  const GpuResult reversed = RunGpu(reversed_logits, vocab, reversed_params);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(again.tokens[r], first.tokens[r]) << "row " << r;
    EXPECT_EQ(again.logprobs[r], first.logprobs[r]) << "row " << r;
    EXPECT_EQ(reversed.tokens[rows - 1 - r], first.tokens[r]) << "row " << r;
    EXPECT_EQ(reversed.logprobs[rows - 1 - r], first.logprobs[r]) << "row " << r;
  }
}

// Independent of the CPU sampler: draws over many token indices follow softmax(z) restricted
// by top-k, within 5 standard deviations.
TEST(CudaSampleRowsTest, DrawsFollowTheDistribution) {
  RS_SKIP_WITHOUT_GPU();
  const int vocab = 4, rows = 4000;
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  }
  for (int top_k : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << top_k);
    std::vector<GpuRowSampling> params;
    for (int r = 0; r < rows; ++r) {
      params.push_back({1.0f, top_k, 1.0f, 12345, static_cast<uint64_t>(r)});
    }
    const GpuResult got = RunGpu(logits, vocab, params);
    std::vector<int> counts(vocab, 0);
    for (int32_t token : got.tokens) {
      ASSERT_GE(token, 0);
      ASSERT_LT(token, vocab);
      ++counts[token];
    }
    const double kept = top_k == 2 ? probs[2] + probs[3] : 1.0;
    for (int id = 0; id < vocab; ++id) {
      const double p = (top_k == 2 && id < 2) ? 0.0 : probs[id] / kept;
      const double sigma = std::sqrt(rows * p * (1.0 - p));
      EXPECT_NEAR(counts[id], rows * p, 5.0 * sigma + 1e-9) << "id " << id;
    }
  }
}

TEST(CudaSampleRowsTest, RejectsBadArguments) {
  // Checked before anything touches the device, so this runs without a GPU too.
  GpuRowSampling params{};
  int32_t token = 0;
  float logit = 0.0f;
  EXPECT_EQ(LaunchSampleRows(&logit, -1, 4, &params, &token, nullptr, nullptr, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchSampleRows(&logit, 1, 0, &params, &token, nullptr, nullptr, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchSampleRows(nullptr, 1, 4, &params, &token, nullptr, nullptr, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchSampleRows(&logit, 1, 4, &params, nullptr, nullptr, nullptr, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LaunchSampleRows(nullptr, 0, 4, nullptr, nullptr, nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace ringserve::cuda
