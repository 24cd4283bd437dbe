// deploy/: the systemd units pass `systemd-analyze verify`, and the example hosts files are
// valid ring descriptions for the models they name.
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "coordinator/hosts/ring_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(DeployTest, SystemdUnitsVerify) {
  absl::StatusOr<std::string> analyze = FindInPath("systemd-analyze");
  ASSERT_TRUE(analyze.ok()) << analyze.status();
  // Verify copies whose binaries exist (the real paths are /usr/local/bin/...).
  TempDir dir;
  const fs::path deploy = fs::path(SourceDir()) / "deploy";
  for (const char* unit : {"ringserve-stage@.service", "ringserve-coordinator.service",
                           "ringserve-mps.service", "ringserve.target"}) {
    std::string text = Read(deploy / unit);
    ASSERT_FALSE(text.empty()) << unit;
    text = std::regex_replace(
        text, std::regex("/usr/(local/)?bin/(stage|coordinator|nvidia-cuda-mps-control)"),
        "/bin/true");
    std::ofstream(fs::path(dir.path()) / unit) << text;
  }
  std::string units = dir.path() + "/ringserve-coordinator.service " + dir.path() +
                      "/ringserve-stage@0.service " + dir.path() + "/ringserve-mps.service " +
                      dir.path() + "/ringserve.target";
  // ringserve-stage@0.service is instantiated from the template in the same directory.
  absl::StatusOr<ProgramResult> verify =
      RunProgram({"sh", "-c",
                  "cd '" + dir.path() + "' && " + *analyze + " verify --man=no " + units + " 2>&1"},
                 absl::Seconds(60));
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_EQ(verify->exit_code, 0) << verify->output;
  EXPECT_EQ(verify->output, "") << verify->output;
}

TEST(DeployTest, StageUnitIsANotifyServiceWithWatchdogAndRestart) {
  std::string unit = Read(fs::path(SourceDir()) / "deploy/ringserve-stage@.service");
  for (const char* line : {"Type=notify\n", "Restart=on-failure\n",
                           "WatchdogSec=", "NotifyAccess=main\n", "TimeoutStartSec=infinity\n"}) {
    EXPECT_THAT(unit, ::testing::HasSubstr(line));
  }
  std::string coordinator = Read(fs::path(SourceDir()) / "deploy/ringserve-coordinator.service");
  // Ordering the coordinator after the stages would deadlock (they are ready once configured).
  EXPECT_THAT(coordinator, ::testing::Not(::testing::HasSubstr("After=ringserve-stage")));
}

TEST(DeployTest, ExampleHostsFilesAreValid) {
  struct Example {
    const char* file;
    int num_layers;  // of the model the file names
    std::vector<int> layers_per_stage;
    int num_hosts;
  };
  const Example examples[] = {
      {"hosts-8-stages-one-host.yaml", 40, {5, 5, 5, 5, 5, 5, 5, 5}, 1},
      {"hosts-6-stages-two-hosts.yaml", 80, {14, 14, 14, 13, 13, 12}, 2},
  };
  for (const Example& example : examples) {
    fs::path path = fs::path(SourceDir()) / "deploy" / example.file;
    absl::StatusOr<RingConfig> config =
        ParseRingConfig(Read(path), path.string(), example.num_layers);
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<int> layers;
    std::set<std::string> hosts;
    for (const StageConfig& stage : config->stages) {
      layers.push_back(stage.num_layers());
      hosts.insert(stage.host);
      EXPECT_TRUE(stage.device.is_cuda()) << example.file;
    }
    EXPECT_EQ(layers, example.layers_per_stage) << example.file;
    EXPECT_EQ(static_cast<int>(hosts.size()), example.num_hosts) << example.file;
    EXPECT_FALSE(config->http_listen.empty()) << example.file << " serves no HTTP API";
    EXPECT_GE(config->effective_micro_batches_in_flight(), config->num_stages()) << example.file;
  }
}

}  // namespace
}  // namespace ringserve::ops
