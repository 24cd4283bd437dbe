#include "coordinator/http/starting_engine.h"

#include <httplib.h>

#include "coordinator/http/fake_engine.h"
#include "coordinator/http/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;

TEST(StartingEngineTest, ShowsProgressThenForwards) {
  StartingEngine front("tiny", {{"h:1", 0, 2}, {"h:2", 2, 4}});
  HttpServer server(front, nullptr, {});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());

  front.SetStageStatus(1, "loading layers [2, 4): 3/9 tensors");
  front.SetStageStatus(7, "no such stage: ignored");
  nlohmann::json data = nlohmann::json::parse(client.Get("/dashboard/data")->body);
  EXPECT_EQ(data["stages"][0]["load_status"], "waiting for the stage");
  EXPECT_EQ(data["stages"][1]["load_status"], "loading layers [2, 4): 3/9 tensors");
  EXPECT_EQ(data["stages"][1]["first_layer"], 2);
  EXPECT_EQ(client.Get("/health")->status, 503);
  nlohmann::json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 1}};
  httplib::Result early = client.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_EQ(early->status, 503);
  EXPECT_THAT(early->body, HasSubstr("starting"));

  FakeEngine engine({.num_stages = 2});
  front.Attach(&engine);
  EXPECT_EQ(client.Get("/health")->status, 200);
  body["model"] = "fake-model";
  EXPECT_EQ(client.Post("/v1/completions", body.dump(), "application/json")->status, 200);
  server.Stop();
}

TEST(StartingEngineTest, FailureIsReported) {
  StartingEngine front("tiny", {{"h:1", 0, 4}});
  front.Fail(absl::UnavailableError("stage 0 (h:1) unreachable"));
  EXPECT_THAT(std::string(front.Tokenize("x", true).status().message()), HasSubstr("unreachable"));
  EXPECT_THAT(front.Stats().stages[0].load_status, HasSubstr("failed"));
}

}  // namespace
}  // namespace ringserve::http
