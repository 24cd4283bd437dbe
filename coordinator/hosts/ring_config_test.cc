#include "coordinator/hosts/ring_config.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 40;

absl::StatusOr<RingConfig> Parse(const std::string& yaml, int num_layers = kLayers) {
  return ParseRingConfig(yaml, "hosts.yaml", num_layers);
}

TEST(RingConfigTest, ParsesFullFileWithCountsRangesAndDashRanges) {
  auto config = Parse(R"(
model: /models/llama
channel: nccl
ring_secret: /etc/ringserve/ring.secret
api:
  grpc: 0.0.0.0:6000
  http: 0.0.0.0:8000
scheduler:
  max_tokens_per_micro_batch: 256
  micro_batches_in_flight: 6
  kv_block_size: 32
  kv_budget: 8GiB
stages:
  - host: 10.0.0.1
    port: 7001
    device: cuda:0
    layers: 14
  - {host: 10.0.0.1, port: 7002, device: "cuda:1", layers: [14, 28]}
  - {host: 10.0.0.2, port: 7001, device: cuda, layers: "28-40"}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_dir, "/models/llama");
  EXPECT_EQ(config->ring_secret_file, "/etc/ringserve/ring.secret");
  EXPECT_EQ(config->channel, ChannelKind::kNccl);
  EXPECT_EQ(config->grpc_listen, "0.0.0.0:6000");
  EXPECT_EQ(config->http_listen, "0.0.0.0:8000");
  EXPECT_EQ(config->scheduler.max_tokens_per_micro_batch, 256);
  EXPECT_EQ(config->scheduler.micro_batches_in_flight, 6);
  EXPECT_EQ(config->effective_micro_batches_in_flight(), 6);
  EXPECT_EQ(config->scheduler.kv_block_size, 32);
  EXPECT_EQ(config->scheduler.kv_budget_bytes, int64_t{8} << 30);
  EXPECT_EQ(config->num_layers, 40);
  ASSERT_EQ(config->num_stages(), 3);
  EXPECT_EQ(config->stages[0].endpoint(), "10.0.0.1:7001");
  EXPECT_EQ(config->stages[0].first_layer, 0);
  EXPECT_EQ(config->stages[0].last_layer, 14);
  EXPECT_EQ(config->stages[1].device.ToString(), "cuda:1");
  EXPECT_EQ(config->stages[1].first_layer, 14);
  EXPECT_EQ(config->stages[1].last_layer, 28);
  EXPECT_EQ(config->stages[2].device, (Device{Device::Kind::kCuda, 0}));
  EXPECT_EQ(config->stages[2].first_layer, 28);
  EXPECT_EQ(config->stages[2].last_layer, 40);
}

TEST(RingConfigTest, KvCacheDtypePerStageDefaultsToAuto) {
  auto config = Parse(R"(
model: m
stages:
  - {host: a, port: 1, kv_cache_dtype: fp8_e4m3}
  - {host: a, port: 2, kv_cache_dtype: auto}
  - {host: a, port: 3}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->stages[0].kv_cache_dtype, KvCacheDtype::kFp8E4m3);
  EXPECT_EQ(config->stages[1].kv_cache_dtype, KvCacheDtype::kAuto);
  EXPECT_EQ(config->stages[2].kv_cache_dtype, KvCacheDtype::kAuto);
  EXPECT_EQ(ParseKvCacheDtype("fp8", "--kv_cache_dtype").status().message(),
            "--kv_cache_dtype: 'fp8' is not a KV cache dtype (auto or fp8_e4m3)");
  EXPECT_EQ(KvCacheElementBytes(KvCacheDtype::kFp8E4m3, 2), 1);
  EXPECT_EQ(KvCacheElementBytes(KvCacheDtype::kAuto, 2), 2);
}

TEST(RingConfigTest, DefaultsAreTcpCpuAndEvenSplit) {
  auto config = Parse(R"(
model: m
stages:
  - {host: localhost, port: 7001}
  - {host: localhost, port: 7002}
  - {host: localhost, port: 7003}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->channel, ChannelKind::kTcp);
  EXPECT_EQ(config->grpc_listen, "127.0.0.1:50051");
  EXPECT_EQ(config->http_listen, "");
  EXPECT_EQ(config->effective_micro_batches_in_flight(), 3);
  EXPECT_EQ(config->stages[0].device.ToString(), "cpu");
  EXPECT_EQ(config->stages[0].num_layers(), 14);
  EXPECT_EQ(config->stages[1].num_layers(), 13);
  EXPECT_EQ(config->stages[2].num_layers(), 13);
  EXPECT_EQ(config->stages[2].last_layer, 40);
}

TEST(RingConfigTest, PartitionListAndLxN) {
  const std::string stages = R"(
stages:
  - {host: a, port: 1}
  - {host: a, port: 2}
  - {host: a, port: 3}
)";
  auto listed = Parse("model: m\npartition: 14,14,12" + stages);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->stages[2].first_layer, 28);
  EXPECT_EQ(listed->stages[2].last_layer, 40);
  auto sequence = Parse("model: m\npartition: [10, 20, 10]" + stages);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ(sequence->stages[1].first_layer, 10);
  EXPECT_EQ(sequence->stages[1].last_layer, 30);

  std::string eight;
  for (int i = 0; i < 8; ++i) eight += "  - {host: h, port: " + std::to_string(100 + i) + "}\n";
  auto lxn = Parse("model: m\npartition: 5x8\nstages:\n" + eight);  // 8 stages of 5 layers
  ASSERT_TRUE(lxn.ok()) << lxn.status();
  ASSERT_EQ(lxn->num_stages(), 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(lxn->stages[i].first_layer, 5 * i);
    EXPECT_EQ(lxn->stages[i].num_layers(), 5);
  }
}

TEST(RingConfigTest, CudaIpcAllowsSeveralStagesOnOneGpu) {
  auto config = Parse(R"(
model: m
channel: cuda_ipc
stages:
  - {host: localhost, port: 1, device: cuda:0}
  - {host: 127.0.0.1, port: 2, device: cuda:0}
)");
  EXPECT_TRUE(config.ok()) << config.status();
}

TEST(RingConfigTest, LayerCountComesFromTheModelDirectory) {
  std::string seen;
  auto config = ParseRingConfig("model: /m/x\nstages: [{host: h, port: 1}]", "f.yaml",
                                [&](const std::string& dir) -> absl::StatusOr<int> {
                                  seen = dir;
                                  return 7;
                                });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(seen, "/m/x");
  EXPECT_EQ(config->stages[0].last_layer, 7);

  auto missing = ParseRingConfig("model: /nope\nstages: [{host: h, port: 1}]", "f.yaml",
                                 [](const std::string&) -> absl::StatusOr<int> {
                                   return absl::NotFoundError("no config.json in /nope");
                                 });
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no config.json in /nope"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("f.yaml"));
}

struct BadCase {
  const char* name;
  const char* yaml;
  std::vector<std::string> fragments;
};

class BadFileTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadFileTest, FailsNamingFieldAndProblem) {
  const BadCase& c = GetParam();
  absl::StatusOr<RingConfig> config = Parse(c.yaml);
  ASSERT_FALSE(config.ok()) << "accepted:\n" << c.yaml;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("hosts.yaml"));
  for (const std::string& fragment : c.fragments) {
    EXPECT_THAT(message, HasSubstr(fragment)) << "yaml:\n" << c.yaml;
  }
}

const BadCase kBadCases[] = {
    {"Empty", "", {"empty"}},
    {"NotAMap", "- a\n- b\n", {"expected a mapping"}},
    {"MalformedYaml", "model: m\nstages: [\n", {"malformed YAML", "line"}},
    {"BadIndent", "model: m\n stages:\n- {host: a, port: 1}\n", {"line"}},
    {"UnknownTopKey",
     "model: m\nstagez: []\nstages: [{host: a, port: 1}]",
     {"stagez", "unknown key"}},
    {"MissingModel", "stages: [{host: a, port: 1}]", {"model", "missing"}},
    {"ModelNotScalar", "model: [a]\nstages: [{host: a, port: 1}]", {"model", "scalar"}},
    {"MissingStages", "model: m", {"stages", "missing"}},
    {"StagesNotList", "model: m\nstages: {host: a}", {"stages", "list"}},
    {"NoStages", "model: m\nstages: []", {"stages", "at least one"}},
    {"UnknownChannel",
     "model: m\nchannel: rdma\nstages: [{host: a, port: 1}]",
     {"channel", "rdma"}},
    {"UnknownDevice",
     "model: m\nstages: [{host: a, port: 1, device: tpu:0}]",
     {"stages[0].device", "unknown device 'tpu:0'"}},
    {"BadCudaOrdinal",
     "model: m\nstages: [{host: a, port: 1, device: 'cuda:x'}]",
     {"stages[0].device", "unknown device"}},
    {"NegativeCuda",
     "model: m\nstages: [{host: a, port: 1, device: 'cuda:-1'}]",
     {"stages[0].device"}},
    {"UnknownKvCacheDtype",
     "model: m\nstages: [{host: a, port: 1}, {host: a, port: 2, kv_cache_dtype: int4}]",
     {"stages[1].kv_cache_dtype", "expected auto or fp8_e4m3, got 'int4'"}},
    {"MissingHost", "model: m\nstages: [{port: 1}]", {"stages[0].host", "missing"}},
    {"BadHost", "model: m\nstages: [{host: 'a:1', port: 1}]", {"stages[0].host", "bad host"}},
    {"MissingPort", "model: m\nstages: [{host: a}]", {"stages[0].port", "missing"}},
    {"PortZero", "model: m\nstages: [{host: a, port: 0}]", {"stages[0].port", "out of range"}},
    {"PortTooBig", "model: m\nstages: [{host: a, port: 70000}]", {"stages[0].port", "70000"}},
    {"PortNotNumber", "model: m\nstages: [{host: a, port: http}]", {"stages[0].port", "integer"}},
    {"UnknownStageKey",
     "model: m\nstages: [{host: a, port: 1, gpu: 0}]",
     {"stages[0].gpu", "unknown key"}},
    {"DuplicateEndpoint",
     "model: m\nstages: [{host: a, port: 1, layers: 20}, {host: a, port: 1, layers: 20}]",
     {"stages[1]", "duplicate endpoint a:1", "stages[0]"}},
    {"DuplicateEndpointLocalhost",
     "model: m\nstages: [{host: localhost, port: 5}, {host: 127.0.0.1, port: 5}]",
     {"stages[1]", "duplicate endpoint"}},
    {"LayersOverlap",
     "model: m\nstages: [{host: a, port: 1, layers: [0, 21]}, {host: a, port: 2, layers: [20, "
     "40]}]",
     {"stages[1].layers", "overlap"}},
    {"LayersGap",
     "model: m\nstages: [{host: a, port: 1, layers: '0-19'}, {host: a, port: 2, layers: "
     "'20-40'}]",
     {"stages[1].layers", "[19, 20) are missing"}},
    {"LayersSumTooSmall",
     "model: m\nstages: [{host: a, port: 1, layers: 10}, {host: a, port: 2, layers: 10}]",
     {"stages", "sum to 20", "has 40"}},
    {"LayersSumTooLarge",
     "model: m\nstages: [{host: a, port: 1, layers: 30}, {host: a, port: 2, layers: 30}]",
     {"stages[1].layers", "past the model's 40 layers"}},
    {"LayersZero",
     "model: m\nstages: [{host: a, port: 1, layers: 0}]",
     {"stages[0].layers", "count >= 1"}},
    {"LayersBackwardRange",
     "model: m\nstages: [{host: a, port: 1, layers: [5, 2]}]",
     {"stages[0].layers", "bad range"}},
    {"LayersThreeNumbers",
     "model: m\nstages: [{host: a, port: 1, layers: [0, 2, 4]}]",
     {"stages[0].layers", "two numbers"}},
    {"LayersJunk",
     "model: m\nstages: [{host: a, port: 1, layers: all}]",
     {"stages[0].layers", "'all'"}},
    {"LayersOnlySomeStages",
     "model: m\nstages: [{host: a, port: 1, layers: 20}, {host: a, port: 2}]",
     {"stages[1].layers", "missing"}},
    {"PartitionAndLayers",
     "model: m\npartition: 20,20\nstages: [{host: a, port: 1, layers: 20}, {host: a, port: 2}]",
     {"partition", "not both"}},
    {"PartitionWrongSum",
     "model: m\npartition: 14,14,11\nstages: [{host: a, port: 1}, {host: a, "
     "port: 2}, {host: a, port: 3}]",
     {"partition", "sums to 39", "has 40"}},
    {"PartitionWrongCount",
     "model: m\npartition: 5x8\nstages: [{host: a, port: 1}]",
     {"partition", "8 entries", "1 stages"}},
    {"PartitionJunk",
     "model: m\npartition: lots\nstages: [{host: a, port: 1}]",
     {"partition", "lots"}},
    {"PartitionZeroEntry",
     "model: m\npartition: 40,0\nstages: [{host: a, port: 1}, {host: a, "
     "port: 2}]",
     {"partition", "counts must be >= 1"}},
    {"NcclWithCpu",
     "model: m\nchannel: nccl\nstages: [{host: a, port: 1, device: cpu}]",
     {"stages[0].device", "nccl needs cuda devices", "cpu"}},
    {"NcclSameGpuTwice",
     "model: m\nchannel: nccl\nstages: [{host: a, port: 1, device: cuda:0}, {host: a, port: 2, "
     "device: cuda:0}]",
     {"stages[1].device", "one GPU per stage", "stages[0]"}},
    {"CudaIpcWithCpu",
     "model: m\nchannel: cuda_ipc\nstages: [{host: a, port: 1}]",
     {"stages[0].device", "cuda_ipc needs cuda devices"}},
    {"CudaIpcAcrossHosts",
     "model: m\nchannel: cuda_ipc\nstages: [{host: a, port: 1, device: cuda:0}, {host: b, port: "
     "1, device: cuda:1}]",
     {"stages[1].host", "one host"}},
    {"BadGrpcAddress",
     "model: m\napi: {grpc: nowhere}\nstages: [{host: a, port: 1}]",
     {"api.grpc", "host:port"}},
    {"BadHttpPort",
     "model: m\napi: {http: '0.0.0.0:99999'}\nstages: [{host: a, port: 1}]",
     {"api.http", "bad port"}},
    {"UnknownApiKey",
     "model: m\napi: {rest: 1}\nstages: [{host: a, port: 1}]",
     {"api.rest", "unknown key"}},
    {"BadBudget",
     "model: m\nscheduler: {kv_budget: 8 parsecs}\nstages: [{host: a, port: 1}]",
     {"scheduler.kv_budget", "8 parsecs"}},
    {"BlocksAndBudget",
     "model: m\nscheduler: {kv_budget: 1GiB, kv_blocks: 10}\nstages: [{host: a, port: 1}]",
     {"scheduler", "exclusive"}},
    {"ZeroTokenBudget",
     "model: m\nscheduler: {max_tokens_per_micro_batch: 0}\nstages: [{host: a, port: 1}]",
     {"scheduler.max_tokens_per_micro_batch", "out of range"}},
    {"NegativeInFlight",
     "model: m\nscheduler: {micro_batches_in_flight: -1}\nstages: [{host: a, port: 1}]",
     {"scheduler.micro_batches_in_flight"}},
    {"UnknownSchedulerKey",
     "model: m\nscheduler: {batch: 4}\nstages: [{host: a, port: 1}]",
     {"scheduler.batch", "unknown key"}},
    {"StageNotMap", "model: m\nstages: [a]", {"stages[0]", "mapping"}},
};

INSTANTIATE_TEST_SUITE_P(Bad, BadFileTest, ::testing::ValuesIn(kBadCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(RingConfigTest, MoreStagesThanLayersIsRefused) {
  auto config = Parse("model: m\nstages: [{host: a, port: 1}, {host: a, port: 2}]", 1);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("at least one layer"));
}

TEST(RingConfigTest, LoadsFromFileAndReportsMissingFile) {
  std::string path = ::testing::TempDir() + "/ring_config_test_hosts.yaml";
  {
    std::ofstream out(path);
    out << "model: m\nstages:\n  - {host: a, port: 1}\n";
  }
  auto config = LoadRingConfig(path, [](const std::string&) -> absl::StatusOr<int> { return 3; });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->source, path);
  EXPECT_EQ(config->stages[0].last_layer, 3);
  std::remove(path.c_str());

  auto missing = LoadRingConfig(path, [](const std::string&) -> absl::StatusOr<int> { return 3; });
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(path));
}

TEST(RingConfigTest, LoadRefusesAFifoOrDeviceWithoutBlockingAndFollowsSymlinks) {
  testing::TempDir dir;
  auto layers = [](const std::string&) -> absl::StatusOr<int> { return 3; };
  const std::string fifo = dir.path() + "/hosts.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<RingConfig> config;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(fifo, [&] { config = LoadRingConfig(fifo, layers); }))
      << "loading blocked on the FIFO";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(fifo));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("not a regular file"));

  const std::string zero = dir.path() + "/zero.yaml";
  std::filesystem::create_symlink("/dev/zero", zero);
  config = LoadRingConfig(zero, layers);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("character device"));

  const std::string real = dir.path() + "/real.yaml";
  std::ofstream(real) << "model: m\nstages:\n  - {host: a, port: 1}\n";
  const std::string link = dir.path() + "/link.yaml";
  std::filesystem::create_symlink(real, link);
  config = LoadRingConfig(link, layers);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->stages[0].last_layer, 3);
}

TEST(RingConfigTest, LoadRefusesAHostsFileAboveTheLimit) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/hosts.yaml";
  std::ofstream(path) << "model: m\nstages:\n  - {host: a, port: 1}\n" << std::string(2 << 20, '#');
  auto config = LoadRingConfig(path, [](const std::string&) -> absl::StatusOr<int> { return 3; });
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("(1 MiB)"));
}

TEST(RingConfigTest, ValidateCatchesConfigsBuiltInCode) {
  auto config = Parse("model: m\nstages: [{host: a, port: 1}, {host: a, port: 2}]");
  ASSERT_TRUE(config.ok());
  RingConfig changed = *config;
  EXPECT_TRUE(ValidateRingConfig(changed).ok());
  changed.stages[1].first_layer = 19;
  EXPECT_THAT(std::string(ValidateRingConfig(changed).message()), HasSubstr("overlap"));
  changed = *config;
  changed.channel = ChannelKind::kNccl;
  EXPECT_THAT(std::string(ValidateRingConfig(changed).message()), HasSubstr("cuda devices"));
}

TEST(RingConfigTest, ParsePartitionAndEvenPartition) {
  EXPECT_EQ(*ParsePartition("14,14,12"), (std::vector<int>{14, 14, 12}));
  EXPECT_EQ(*ParsePartition(" 8x5 "), (std::vector<int>{8, 8, 8, 8, 8}));
  EXPECT_EQ(*ParsePartition("5x8"), (std::vector<int>(8, 5)));
  EXPECT_EQ(*ParsePartition("40"), (std::vector<int>{40}));
  for (const char* bad : {"", "1,,2", "a,b", "2x", "x3", "0x5", "3x0", "1,-2", "1,2,"}) {
    EXPECT_FALSE(ParsePartition(bad).ok()) << bad;
  }
  EXPECT_EQ(*EvenPartition(40, 3), (std::vector<int>{14, 13, 13}));
  EXPECT_EQ(*EvenPartition(4, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_FALSE(EvenPartition(3, 4).ok());
  EXPECT_FALSE(EvenPartition(3, 0).ok());
}

TEST(RingConfigTest, ParseDeviceAndChannel) {
  EXPECT_EQ(ParseDevice("cpu")->ToString(), "cpu");
  EXPECT_EQ(ParseDevice("cuda")->ToString(), "cuda:0");
  EXPECT_EQ(ParseDevice("cuda:7")->index, 7);
  for (const char* bad : {"gpu", "cuda:", "cuda:a", "CUDA:0", "cuda:-1", "cuda:99999"}) {
    EXPECT_FALSE(ParseDevice(bad).ok()) << bad;
  }
  for (ChannelKind kind : {ChannelKind::kTcp, ChannelKind::kCudaIpc, ChannelKind::kNccl}) {
    EXPECT_EQ(ParseChannelKind(ChannelKindName(kind)), kind);
  }
  EXPECT_FALSE(ParseChannelKind("TCP").has_value());
}

DefaultRingOptions DefaultOptions(const std::string& model_dir, int num_layers, int num_stages) {
  DefaultRingOptions options;
  options.model_dir = model_dir;
  options.num_layers = num_layers;
  options.num_stages = num_stages;
  return options;
}

TEST(RingConfigTest, DefaultRingHasLocalCpuStagesOnDistinctFreePorts) {
  auto config = DefaultRingConfig(DefaultOptions("/models/tiny", 4, 3));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_dir, "/models/tiny");
  EXPECT_EQ(config->channel, ChannelKind::kTcp);
  ASSERT_EQ(config->num_stages(), 3);
  std::set<int> ports;
  for (const StageConfig& stage : config->stages) {
    EXPECT_EQ(stage.host, "127.0.0.1");
    EXPECT_FALSE(stage.device.is_cuda());
    EXPECT_GT(stage.control_port, 0);
    ports.insert(stage.control_port);
  }
  EXPECT_EQ(ports.size(), 3u);
  EXPECT_EQ(config->stages[0].num_layers(), 2);
  EXPECT_EQ(config->stages[2].last_layer, 4);
  EXPECT_TRUE(ValidateRingConfig(*config).ok());

  auto clamped = DefaultRingConfig(DefaultOptions("m", 2, 8));
  ASSERT_TRUE(clamped.ok());
  EXPECT_EQ(clamped->num_stages(), 2);
  EXPECT_FALSE(DefaultRingConfig(DefaultOptions("m", 0, 2)).ok());
}

// Micro-batches in flight default to the stages that can run at once: one per GPU.
TEST(RingConfigTest, MicroBatchesDefaultToTheGpusThatCanRunAtOnce) {
  DefaultRingOptions options = DefaultOptions("m", 8, 4);
  options.partition = {2, 2, 2, 2};
  options.device = Device{.kind = Device::Kind::kCuda, .index = 0};
  options.channel = ChannelKind::kCudaIpc;
  auto shared = DefaultRingConfig(options);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->num_stages(), 4);
  EXPECT_EQ(shared->num_parallel_stages(), 1);
  EXPECT_EQ(shared->effective_micro_batches_in_flight(), 1);

  // 8 stages on 4 GPUs of one host (two per GPU), and the explicit knob wins.
  RingConfig config = *shared;
  config.stages.clear();
  for (int i = 0; i < 8; ++i) {
    config.stages.push_back({.host = i % 2 ? "localhost" : "127.0.0.1",
                             .control_port = 7000 + i,
                             .device = Device{.kind = Device::Kind::kCuda, .index = i / 2},
                             .first_layer = i,
                             .last_layer = i + 1});
  }
  EXPECT_EQ(config.num_parallel_stages(), 4);
  EXPECT_EQ(config.effective_micro_batches_in_flight(), 4);
  config.scheduler.micro_batches_in_flight = 6;
  EXPECT_EQ(config.effective_micro_batches_in_flight(), 6);

  // CPU stages each count.
  auto cpu = DefaultRingConfig(DefaultOptions("m", 4, 3));
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->effective_micro_batches_in_flight(), 3);
}

}  // namespace
}  // namespace ringserve
