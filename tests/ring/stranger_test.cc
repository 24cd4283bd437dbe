// Strangers on a stage's ports, with real `stage` processes on loopback: control calls without
// the ring secret or with a wrong one, a flood of challenges, a second coordinator while the
// stage belongs to the first, a model outside the model root, an activation connection that
// cannot prove the secret, silent activation connections ahead of the real peer, and a stage
// asked to listen beyond loopback without a secret.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/ring_secret.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/stage.grpc.pb.h"
#include "ring/control_auth.h"
#include "stage/channels/tcp_channel.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

std::string Env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}
std::string SourceDir() { return Env("RINGSERVE_SOURCE_DIR", "."); }
std::string StageBinary() { return Env("RINGSERVE_BINARY_DIR", "build") + "/stage/stage"; }
std::string ModelDir() { return SourceDir() + "/tests/fixtures/models/llama"; }

std::string WriteSecret(const std::string& name, const std::string& key) {
  std::string path = ::testing::TempDir() + "/rs_stranger_" + std::to_string(getpid()) + name;
  unlink(path.c_str());
  { std::ofstream(path) << key << "\n"; }
  chmod(path.c_str(), 0600);
  return path;
}

// One control connection to a stage, with the credentials it was given (maybe none, maybe
// wrong).
class ControlClient {
 public:
  ControlClient(const std::string& endpoint, ControlCredentials creds)
      : stub_(v1::StageControl::NewStub(
            grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()))),
        creds_(std::move(creds)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ChallengeResponse challenge;
    EXPECT_TRUE(stub_->Challenge(&context, v1::ChallengeRequest(), &challenge).ok());
    nonce_ = challenge.nonce();
    secret_required_ = challenge.secret_required();
  }
  void Prepare(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    AddControlProof(creds_, nonce_, context);
  }
  grpc::Status Configure(const v1::ConfigureRequest& request, std::string* data_endpoint) {
    grpc::ClientContext context;
    Prepare(&context);
    auto reader = stub_->Configure(&context, request);
    v1::LoadProgress progress;
    while (reader->Read(&progress)) {
      if (!progress.data_endpoint().empty() && data_endpoint != nullptr) {
        *data_endpoint = progress.data_endpoint();
      }
    }
    return reader->Finish();
  }
  grpc::Status Shutdown() {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ShutdownResponse response;
    return stub_->Shutdown(&context, v1::ShutdownRequest(), &response);
  }
  grpc::Status Health() {
    grpc::ClientContext context;
    Prepare(&context);
    v1::StageHealthResponse response;
    return stub_->Health(&context, v1::StageHealthRequest(), &response);
  }
  grpc::Status Steps() {
    grpc::ClientContext context;
    Prepare(&context);
    auto stream = stub_->Steps(&context);
    stream->WritesDone();
    v1::StepResult result;
    while (stream->Read(&result)) {
    }
    return stream->Finish();
  }
  grpc::Status ConnectPeers(const v1::ConnectPeersRequest& request) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ConnectPeersResponse response;
    return stub_->ConnectPeers(&context, request, &response);
  }
  bool secret_required() const { return secret_required_; }

 private:
  std::unique_ptr<v1::StageControl::Stub> stub_;
  ControlCredentials creds_;
  std::string nonce_;
  bool secret_required_ = false;
};

v1::ConfigureRequest LastStageOfTwo(const std::string& model_dir) {
  v1::ConfigureRequest request;
  request.set_stage_index(1);
  request.set_num_stages(2);
  request.set_model_dir(model_dir);
  request.set_first_layer(2);
  request.set_last_layer(4);
  request.set_device("cpu");
  request.set_kv_block_size(16);
  request.set_kv_num_blocks(16);
  request.set_channel("tcp");
  return request;
}

class StrangerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_path_ = WriteSecret("ring", kKey);
    SubprocessOptions spawn;
    spawn.argv = {StageBinary(),
                  "--listen",
                  "127.0.0.1:0",
                  "--ring_secret",
                  secret_path_,
                  "--model_root",
                  SourceDir() + "/tests/fixtures/models",
                  "--ready_fd",
                  "3"};
    spawn.ready_fd = true;
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
    ASSERT_TRUE(process.ok()) << process.status();
    stage_ = std::make_unique<Subprocess>(std::move(*process));
    absl::StatusOr<std::string> line = stage_->ReadReadyLine(absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << line.status();
    endpoint_ = *line;
  }
  void TearDown() override {
    if (stage_) stage_->Terminate(absl::Seconds(2));
  }
  ControlCredentials Owner(const std::string& id = "coordinator-a") {
    return {.coordinator_id = id, .secret = RingSecret::FromBytes(kKey)};
  }
  // The stage process still runs (a refused Shutdown did not stop it).
  bool StageAlive() { return ControlClient(endpoint_, Owner("probe")).Health().ok(); }

  static constexpr char kKey[] = "0123456789abcdef0123456789abcdef";
  std::string secret_path_;
  std::unique_ptr<Subprocess> stage_;
  std::string endpoint_;
};

TEST_F(StrangerTest, ControlCallsWithoutTheSecretAreRefused) {
  ControlClient stranger(endpoint_, {.coordinator_id = "stranger", .secret = std::nullopt});
  EXPECT_TRUE(stranger.secret_required());
  EXPECT_EQ(stranger.Shutdown().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status configure = stranger.Configure(LastStageOfTwo(ModelDir()), nullptr);
  EXPECT_EQ(configure.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(configure.error_message(), HasSubstr("ring secret"));
  EXPECT_EQ(stranger.Steps().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stranger.Health().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stranger.ConnectPeers({}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(StageAlive());
}

TEST_F(StrangerTest, AWrongSecretOrAForgedNonceIsRefused) {
  ControlClient wrong(endpoint_, {.coordinator_id = "stranger",
                                  .secret = RingSecret::FromBytes("not-the-ring-secret-at-all")});
  EXPECT_EQ(wrong.Shutdown().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.Configure(LastStageOfTwo(ModelDir()), nullptr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The right secret over a nonce the stage never issued (replayed or made up).
  auto stub =
      v1::StageControl::NewStub(grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  AddControlProof(Owner(), "00112233445566778899aabbccddeeff", &context);
  v1::ShutdownResponse response;
  EXPECT_EQ(stub->Shutdown(&context, v1::ShutdownRequest(), &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(StageAlive());
}

TEST_F(StrangerTest, ChallengesFromStrangersDoNotExpireTheOwnersNonce) {
  ControlClient owner(endpoint_, Owner());
  // Challenge needs no secret: a stranger may call it as often as it likes while the owner
  // is between its own Challenge and its calls (a ring loading a large model takes minutes).
  auto stranger =
      v1::StageControl::NewStub(grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 1000; ++i) {
    grpc::ClientContext context;
    v1::ChallengeResponse challenge;
    ASSERT_TRUE(stranger->Challenge(&context, v1::ChallengeRequest(), &challenge).ok());
  }
  EXPECT_TRUE(owner.Health().ok());
  grpc::Status configured = owner.Configure(LastStageOfTwo(ModelDir()), nullptr);
  EXPECT_TRUE(configured.ok()) << configured.error_message();
}

TEST_F(StrangerTest, TheStageBelongsToTheCoordinatorThatConfiguredIt) {
  ControlClient owner(endpoint_, Owner("coordinator-a"));
  std::string data_endpoint;
  grpc::Status configured = owner.Configure(LastStageOfTwo(ModelDir()), &data_endpoint);
  ASSERT_TRUE(configured.ok()) << configured.error_message();
  // Another coordinator, even one with the secret, cannot take it over or stop it.
  ControlClient second(endpoint_, Owner("coordinator-b"));
  grpc::Status taken = second.Configure(LastStageOfTwo(ModelDir()), nullptr);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(taken.error_message(), HasSubstr("belongs to coordinator"));
  EXPECT_EQ(second.Shutdown().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(second.ConnectPeers({}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(StageAlive());
  // The owner can.
  EXPECT_TRUE(owner.Shutdown().ok());
  EXPECT_TRUE(stage_->Wait(absl::Seconds(10)).ok());
}

TEST_F(StrangerTest, ModelsOutsideTheModelRootAreRefused) {
  ControlClient owner(endpoint_, Owner());
  grpc::Status status = owner.Configure(LastStageOfTwo("/etc"), nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("model root"));
  status = owner.Configure(LastStageOfTwo(ModelDir() + "/../../../../etc"), nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A refused Configure leaves the stage configurable.
  EXPECT_TRUE(owner.Configure(LastStageOfTwo(ModelDir()), nullptr).ok());
}

TEST_F(StrangerTest, AConfigureThatCannotBeMetLeavesTheStageConfigurable) {
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  overcommit >> mode;
  if (mode == 1) GTEST_SKIP() << "vm.overcommit_memory=1: a huge KV pool would be OOM-killed";
  ControlClient owner(endpoint_, Owner());
  v1::ConfigureRequest huge = LastStageOfTwo(ModelDir());
  huge.set_kv_num_blocks(1 << 30);
  grpc::Status status = owner.Configure(huge, nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(owner.Configure(LastStageOfTwo(ModelDir()), nullptr).ok());
}

TEST_F(StrangerTest, AnActivationConnectionWithoutTheSecretIsRefused) {
  ControlClient owner(endpoint_, Owner());
  std::string data_endpoint;
  ASSERT_TRUE(owner.Configure(LastStageOfTwo(ModelDir()), &data_endpoint).ok());
  ASSERT_FALSE(data_endpoint.empty());
  v1::ConnectPeersRequest peers;
  peers.set_prev_data_endpoint("127.0.0.1:1");  // informational on the receiving side
  peers.set_timeout_ms(20000);
  grpc::Status connected;
  std::thread connect([&] { connected = owner.ConnectPeers(peers); });
  // A stranger that knows the hello but not the secret, then one with a wrong secret.
  absl::StatusOr<std::unique_ptr<TcpLink>> plain =
      TcpConnectLink(data_endpoint, 0, absl::Seconds(10));
  ASSERT_TRUE(plain.ok()) << plain.status();  // the hello goes out; the proof never comes
  plain->reset();
  RingSecret wrong = RingSecret::FromBytes("not-the-ring-secret-at-all");
  absl::StatusOr<std::unique_ptr<TcpLink>> forged =
      TcpConnectLink(data_endpoint, 0, absl::Seconds(10), &wrong);
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied) << forged.status();
  // The real previous stage is still accepted afterwards.
  RingSecret right = RingSecret::FromBytes(kKey);
  absl::StatusOr<std::unique_ptr<TcpLink>> real =
      TcpConnectLink(data_endpoint, 0, absl::Seconds(10), &right);
  EXPECT_TRUE(real.ok()) << real.status();
  connect.join();
  EXPECT_TRUE(connected.ok()) << connected.error_message();
}

// Strangers that connect to the activation port and stay silent (some before ConnectPeers,
// some after, some after sending the hello) do not hold up the real previous stage: it is
// admitted well before even one of them would have used up its 5 s handshake limit.
TEST_F(StrangerTest, SilentActivationConnectionsDoNotDelayTheRealPeer) {
  ControlClient owner(endpoint_, Owner());
  std::string data_endpoint;
  ASSERT_TRUE(owner.Configure(LastStageOfTwo(ModelDir()), &data_endpoint).ok());
  ASSERT_FALSE(data_endpoint.empty());
  std::vector<std::unique_ptr<TcpLink>> strangers;
  auto silent = [&] {
    // The hello only (no secret: no proof follows), or nothing at all.
    if (strangers.size() % 2 == 0) {
      absl::StatusOr<std::unique_ptr<TcpLink>> hello =
          TcpConnectLink(data_endpoint, 0, absl::Seconds(10));
      ASSERT_TRUE(hello.ok()) << hello.status();
      strangers.push_back(std::move(*hello));
      return;
    }
    std::string host;
    int port = 0;
    ASSERT_TRUE(SplitHostPort(data_endpoint, "test", &host, &port).ok());
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    strangers.push_back(std::make_unique<TcpLink>(fd, "stranger"));
  };
  for (int i = 0; i < 4; ++i) silent();  // waiting in the backlog while the stage loads
  v1::ConnectPeersRequest peers;
  peers.set_prev_data_endpoint("127.0.0.1:1");  // informational on the receiving side
  peers.set_timeout_ms(30000);
  grpc::Status connected;
  std::thread connect([&] { connected = owner.ConnectPeers(peers); });
  for (int i = 0; i < 4; ++i) silent();  // and arriving while it accepts
  const absl::Time start = absl::Now();
  RingSecret right = RingSecret::FromBytes(kKey);
  absl::StatusOr<std::unique_ptr<TcpLink>> real =
      TcpConnectLink(data_endpoint, 0, absl::Seconds(30), &right);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(real.ok()) << real.status();
  connect.join();
  EXPECT_TRUE(connected.ok()) << connected.error_message();
  EXPECT_LT(took, absl::Milliseconds(2500)) << "one silent connection alone may hold 5 s";
  EXPECT_TRUE(StageAlive());
}

TEST(StageListenTest, NonLoopbackWithoutASecretIsRefused) {
  SubprocessOptions spawn;
  spawn.argv = {StageBinary(), "--listen", "0.0.0.0:0", "--ready_fd", "3"};
  spawn.ready_fd = true;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<int> code = process->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 2);
  // A world-readable secret is refused too.
  std::string open_secret = WriteSecret("open", "0123456789abcdef0123456789abcdef");
  chmod(open_secret.c_str(), 0644);
  spawn.argv = {StageBinary(), "--listen", "127.0.0.1:0", "--ring_secret", open_secret};
  process = Subprocess::Spawn(spawn);
  ASSERT_TRUE(process.ok());
  code = process->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);
}

}  // namespace
}  // namespace ringserve
