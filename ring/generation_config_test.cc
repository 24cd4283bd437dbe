#include "ring/generation_config.h"

#include <fstream>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The generation_config.json files of released checkpoints.
constexpr char kGptOss20B[] = R"json({
  "bos_token_id": 199998,
  "do_sample": true,
  "eos_token_id": [200002, 199999, 200012],
  "pad_token_id": 199999,
  "transformers_version": "4.55.0.dev0"
})json";
constexpr char kQwen25Instruct[] = R"json({
  "bos_token_id": 151643,
  "pad_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [151645, 151643],
  "repetition_penalty": 1.05,
  "temperature": 0.7,
  "top_p": 0.8,
  "top_k": 20,
  "transformers_version": "4.37.0"
})json";
constexpr char kDeepseekV3[] = R"json({
  "_from_model_config": true,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "do_sample": true,
  "temperature": 0.6,
  "top_p": 0.95,
  "transformers_version": "4.46.3"
})json";
// What transformers 5 writes for a model whose config has no eos_token_id.
constexpr char kNoEos[] = R"json({
  "_from_model_config": true,
  "bos_token_id": null,
  "eos_token_id": null,
  "output_attentions": false,
  "output_hidden_states": false,
  "transformers_version": "5.0.0",
  "use_cache": true
})json";

TEST(GenerationConfigTest, ReadsEosAsAnIntegerOrAList) {
  auto ids = ParseGenerationEosTokenIds(kGptOss20B, "g.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(200002, 199999, 200012));
  ids = ParseGenerationEosTokenIds(kQwen25Instruct, "g.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(151645, 151643));
  ids = ParseGenerationEosTokenIds(kDeepseekV3, "g.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(1));
  ids = ParseGenerationEosTokenIds(kNoEos, "g.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, IsEmpty());
  ids = ParseGenerationEosTokenIds("{}", "g.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, IsEmpty());
}

TEST(GenerationConfigTest, RefusesMalformedIdsNamingTheFile) {
  for (const char* text :
       {R"({"eos_token_id": "</s>"})", R"({"eos_token_id": [2, 2.5]})",
        R"({"eos_token_id": 4294967296})", R"({"eos_token_id": -1})", "[1, 2]", "{not json"}) {
    auto ids = ParseGenerationEosTokenIds(text, "model/generation_config.json");
    ASSERT_FALSE(ids.ok()) << text;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("model/generation_config.json"));
  }
}

TEST(GenerationConfigTest, LoadIsEmptyWithoutTheFile) {
  testing::TempDir dir;
  auto ids = LoadGenerationEosTokenIds(dir.path());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, IsEmpty());
  std::ofstream(dir.path() + "/generation_config.json") << kGptOss20B;
  ids = LoadGenerationEosTokenIds(dir.path());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(200002, 199999, 200012));
}

TEST(GenerationConfigTest, MergeKeepsConfigOrderAndAddsTheRest) {
  // gpt-oss-20b: config.json's 200002, then what generation_config.json adds.
  EXPECT_THAT(MergeEosTokenIds({200002}, {200002, 199999, 200012}),
              ElementsAre(200002, 199999, 200012));
  EXPECT_THAT(MergeEosTokenIds({151645}, {151645, 151643}), ElementsAre(151645, 151643));
  EXPECT_THAT(MergeEosTokenIds({}, {1}), ElementsAre(1));
  EXPECT_THAT(MergeEosTokenIds({2, 7}, {}), ElementsAre(2, 7));
}

TEST(GenerationConfigTest, EosIdsAreConfigsThenWhatTheGenerationConfigAdds) {
  testing::TempDir dir;
  ModelConfig config;
  config.eos_token_ids = {200002};
  auto ids = LoadEosTokenIds(dir.path(), config);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(200002));
  std::ofstream(dir.path() + "/generation_config.json") << kGptOss20B;
  ids = LoadEosTokenIds(dir.path(), config);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(200002, 199999, 200012));
  std::ofstream(dir.path() + "/generation_config.json") << R"({"eos_token_id": "x"})";
  EXPECT_THAT(std::string(LoadEosTokenIds(dir.path(), config).status().message()),
              HasSubstr("generation_config.json"));
}

}  // namespace
}  // namespace ringserve
