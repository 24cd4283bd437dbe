// The real tokenizers beyond the goldens: tokenizer_config.json handling, lookups, bad input,
// and that the golden comparison notices a single edited merge or regex.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_test_util.h"

namespace ringserve {
namespace {

using tokenizer_testing::FixturePath;
using tokenizer_testing::ReadFileOrEmpty;
using tokenizer_testing::TokenizerDir;

const Tokenizer& Load(const std::string& name) {
  static auto* cache = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  auto& slot = (*cache)[name];
  if (slot == nullptr) {
    auto loaded = Tokenizer::FromDirectory(TokenizerDir(name));
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      std::abort();
    }
    slot = std::move(loaded).value();
  }
  return *slot;
}

TEST(RealTokenizerTest, SpecialTokenIdsComeFromTheConfig) {
  const Tokenizer& qwen = Load("qwen3");
  EXPECT_FALSE(qwen.bos_token_id().has_value());
  EXPECT_EQ(qwen.eos_token_id(), qwen.TokenToId("<|im_end|>"));
  EXPECT_EQ(qwen.pad_token_id(), qwen.TokenToId("<|endoftext|>"));
  EXPECT_EQ(qwen.TokenToId("<|im_end|>"), 151645);
  EXPECT_TRUE(qwen.IsSpecial(151645));
  EXPECT_FALSE(qwen.IsSpecial(*qwen.TokenToId("<think>")));  // added, not special
  EXPECT_EQ(qwen.vocab_size(), 151669);

  const Tokenizer& llama = Load("llama3");
  EXPECT_EQ(llama.bos_token_id(), 128000);
  EXPECT_EQ(llama.eos_token_id(), 128001);
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.SpecialTokenIds().size(), 256u);

  const Tokenizer& deepseek = Load("deepseek_v3");
  EXPECT_EQ(deepseek.bos_token_id(), 0);
  EXPECT_EQ(deepseek.eos_token_id(), 1);
}

TEST(RealTokenizerTest, TokenAndIdLookupsAreInverse) {
  const Tokenizer& llama = Load("llama3");
  for (int32_t id : {0, 1, 220, 1820, 127999, 128000, 128255}) {
    auto token = llama.IdToToken(id);
    ASSERT_TRUE(token.has_value()) << id;
    EXPECT_EQ(llama.TokenToId(*token), id) << *token;
  }
  EXPECT_EQ(llama.IdToToken(128256), std::nullopt);
  EXPECT_EQ(llama.IdToToken(-1), std::nullopt);
  EXPECT_EQ(llama.TokenToId("Ġthe"), 279);
  EXPECT_EQ(llama.TokenToId("no such token at all"), std::nullopt);
}

TEST(RealTokenizerTest, ConfigAddBosTokenAddsBosLikeTransformers) {
  // DeepSeek V3's tokenizer_config.json says add_bos_token; its tokenizer.json does not add it.
  const Tokenizer& deepseek = Load("deepseek_v3");
  auto with = deepseek.Encode("Hello", /*add_special_tokens=*/true);
  auto without = deepseek.Encode("Hello", /*add_special_tokens=*/false);
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_EQ(with->size(), without->size() + 1);
  EXPECT_EQ((*with)[0], 0);
  // Qwen3 asks for none; Llama 3's files add none either.
  auto qwen = Load("qwen3").Encode("Hello", true);
  EXPECT_EQ(*qwen, *Load("qwen3").Encode("Hello", false));
}

TEST(RealTokenizerTest, SpecialTokenStringsInTextBecomeTheirIds) {
  const Tokenizer& qwen = Load("qwen3");
  auto ids = qwen.Encode("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 3u);
  EXPECT_EQ(ids->front(), 151644);
  EXPECT_EQ(ids->back(), 151645);
  EXPECT_EQ(qwen.Decode(*ids, /*skip_special_tokens=*/true), "user\nhi");
  EXPECT_EQ(qwen.Decode(*ids, /*skip_special_tokens=*/false), "<|im_start|>user\nhi<|im_end|>");
}

TEST(RealTokenizerTest, InvalidUtf8IsRejectedWithItsByteOffset) {
  const Tokenizer& llama = Load("llama3");
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, int>>{{"abc\xff", 3},
                                                {"ok \xc3", 3},   // truncated two-byte sequence
                                                {"\xc0\xaf", 0},  // overlong '/'
                                                {"x\xed\xa0\x80y", 1},    // surrogate
                                                {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
                                                {"good text \xe2\x82 bad", 10}}) {
    auto ids = llama.Encode(text, false);
    ASSERT_FALSE(ids.ok()) << "offset " << offset;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos) << ids.status();
    EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(offset)),
              std::string::npos)
        << ids.status();
  }
}

// Counts corpus texts whose encoding by `tokenizer` differs from the qwen3 goldens.
int CountGoldenDifferences(const Tokenizer& tokenizer) {
  const auto texts = nlohmann::json::parse(ReadFileOrEmpty(FixturePath("corpus.json")))
                         .get<std::vector<std::string>>();
  const auto golden = nlohmann::json::parse(ReadFileOrEmpty(FixturePath("golden_qwen3.json")));
  int differences = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tokenizer.Encode(texts[i], false);
    if (!ids.ok() || *ids != golden["cases"][i]["ids"].get<std::vector<int32_t>>()) ++differences;
  }
  return differences;
}

class MutationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spec_ = new nlohmann::json(
        nlohmann::json::parse(ReadFileOrEmpty(TokenizerDir("qwen3") + "/tokenizer.json")));
  }
  static std::unique_ptr<Tokenizer> Build(const nlohmann::json& spec) {
    auto tokenizer = Tokenizer::FromJson(spec.dump(), "", {.apply_config_special_tokens = false});
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
  }
  static nlohmann::json* spec_;
};
nlohmann::json* MutationTest::spec_ = nullptr;

TEST_F(MutationTest, OneRemovedMergeRuleIsDetected) {
  nlohmann::json spec = *spec_;
  auto& merges = spec["model"]["merges"];
  size_t index = merges.size();
  for (size_t i = 0; i < merges.size(); ++i) {
    if (merges[i] == nlohmann::json::array({"Ġth", "e"})) index = i;
  }
  ASSERT_LT(index, merges.size()) << "merge (Ġth, e) not found";
  merges.erase(index);
  auto tokenizer = Build(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_GT(CountGoldenDifferences(*tokenizer), 0);
}

TEST_F(MutationTest, OneChangedSplitRegexIsDetected) {
  nlohmann::json spec = *spec_;
  auto& regex = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  std::string pattern = regex.get<std::string>();
  // Drop the alternative that leaves the last space of a run to the next word.
  const std::string alternative = "|\\s+(?!\\S)";
  const size_t at = pattern.find(alternative);
  ASSERT_NE(at, std::string::npos) << pattern;
  pattern.erase(at, alternative.size());
  regex = pattern;
  auto tokenizer = Build(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_GT(CountGoldenDifferences(*tokenizer), 0);
}

}  // namespace
}  // namespace ringserve
