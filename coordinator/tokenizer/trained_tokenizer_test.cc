// The demo model's tokenizer (models/ringserve-tiny, trained by scripts/train_small_model.py)
// against the ids Hugging Face `tokenizers` gave when it was trained
// (tests/fixtures/trained/tokenizer_golden.json: held-out documents and edge cases).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_test_util.h"

namespace ringserve {
namespace {

using tokenizer_testing::ReadFileOrEmpty;
using tokenizer_testing::SourceDir;

class TrainedTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = SourceDir() + "/tests/fixtures/trained/tokenizer_golden.json";
    golden_ = nlohmann::json::parse(ReadFileOrEmpty(path), nullptr, false);
    ASSERT_FALSE(golden_.is_discarded()) << "cannot read " << path;
    auto loaded = Tokenizer::FromDirectory(SourceDir() + "/models/ringserve-tiny");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    tokenizer_ = std::move(loaded).value();
  }
  nlohmann::json golden_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TrainedTokenizerTest, EncodesLikeHuggingFaceTokenizers) {
  ASSERT_GE(golden_["cases"].size(), 10u);
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(text.substr(0, 80));
    auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>());
    auto with_bos = tokenizer_->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(with_bos.ok()) << with_bos.status();
    EXPECT_EQ(*with_bos, c["ids_with_bos"].get<std::vector<int32_t>>());
  }
}

TEST_F(TrainedTokenizerTest, DecodesBackToTheText) {
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tokenizer_->Decode(c["ids"].get<std::vector<int32_t>>(), false), text);
  }
}

TEST_F(TrainedTokenizerTest, NamesBosAndEos) {
  EXPECT_EQ(tokenizer_->bos_token_id(), std::optional<int32_t>(0));
  EXPECT_EQ(tokenizer_->eos_token_id(), std::optional<int32_t>(1));
}

}  // namespace
}  // namespace ringserve
