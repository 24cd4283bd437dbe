#include "coordinator/http/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;

TEST(HistogramTest, BucketsAreCumulativeAndBoundsInclusive) {
  Histogram h({1, 2, 5});
  h.Observe(0.5);
  h.Observe(1);  // le="1" includes 1
  h.Observe(3);
  h.Observe(100);
  Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 2, 3, 4}));
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.sum, 104.5);
}

TEST(MetricsTest, FormatsValuesAndEscapesLabels) {
  EXPECT_EQ(FormatSampleValue(0.25), "0.25");
  EXPECT_EQ(FormatSampleValue(3), "3");
  EXPECT_EQ(FormatSampleValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsTest, RendersEveryFamilyFromStats) {
  ServingMetrics metrics;
  metrics.RecordOutcome("http", RequestOutcome::kStop);
  metrics.ObserveTimeToFirstToken(0.02);
  metrics.ObserveInterTokenLatency(0.003);
  RingStats stats;
  stats.stages.push_back({.index = 0,
                          .endpoint = "h:1",
                          .first_layer = 0,
                          .last_layer = 5,
                          .busy_fraction = 0.75,
                          .mean_step_ms = 2.5,
                          .micro_batches_in_flight = 2,
                          .kv_blocks_used = 10,
                          .kv_blocks_total = 64,
                          .bytes_sent = 4096,
                          .load_status = "ready"});
  stats.stages.push_back({.index = 1,
                          .endpoint = "h:2",
                          .first_layer = 5,
                          .last_layer = 10,
                          .busy_fraction = 0.5,
                          .kv_blocks_used = 10,
                          .kv_blocks_total = 64,
                          .load_status = "loading 3/9 tensors"});
  stats.requests.generated_tokens = 123;
  stats.requests.queue_depth = 4;
  stats.requests.ring_restarts = 2;
  stats.requests.resumed_requests = 5;
  stats.requests.speculative_verifications = 4;
  stats.requests.speculative_drafts_verified = 16;
  stats.requests.speculative_drafts_accepted = 12;
  stats.requests.speculative_verification_tokens = 16;
  ModelInfo model;
  model.model_id = "my \"model\"";
  std::string text = RenderPrometheus(metrics, stats, model);
  EXPECT_THAT(text, HasSubstr("ringserve_model_info{model=\"my \\\"model\\\"\""));
  EXPECT_THAT(text, HasSubstr("ringserve_requests_total{api=\"http\",outcome=\"stop\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_requests_total{api=\"http\",outcome=\"error\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_generation_tokens_total 123\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_queue_depth 4\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_ring_restarts_total 2\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_resumed_requests_total 5\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_busy_ratio{stage=\"0\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_step_seconds{stage=\"0\"} 0.0025\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_kv_blocks{stage=\"0\",state=\"free\"} 54\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_micro_batches_in_flight{stage=\"0\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_sent_bytes_total{stage=\"0\",hop=\"0->1\"} 4096\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_stage_ready{stage=\"1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_inter_token_latency_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE ringserve_time_to_first_token_seconds histogram\n"));
  // Speculative decoding, on the last stage.
  EXPECT_THAT(text, HasSubstr("ringserve_speculative_acceptance_rate{stage=\"1\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_speculative_tokens_per_step{stage=\"1\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("ringserve_speculative_accepted_tokens_total{stage=\"1\"} 12\n"));
  // The last stage sends tokens back, not activations: no hop series for it.
  EXPECT_THAT(text, ::testing::Not(HasSubstr("hop=\"1->2\"")));
}

}  // namespace
}  // namespace ringserve::http
