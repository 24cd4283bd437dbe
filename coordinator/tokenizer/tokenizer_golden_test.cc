// The three real tokenizers against Hugging Face `tokenizers` goldens
// (scripts/make_tokenizer_goldens.py -> tests/fixtures/tokenizers/).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_test_util.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve {
namespace {

using tokenizer_testing::FixturePath;
using tokenizer_testing::ReadFileOrEmpty;
using tokenizer_testing::TokenizerDir;

struct Golden {
  nlohmann::json json;
  std::vector<std::string> texts;
};

// Loaded once per test binary: the tokenizers take a while to load.
class Shared {
 public:
  static Shared& Get() {
    static Shared* shared = new Shared();
    return *shared;
  }
  const std::vector<std::string>& texts() const { return texts_; }
  const nlohmann::json* golden(const std::string& name) {
    auto& slot = goldens_[name];
    if (slot == nullptr) {
      const std::string text = ReadFileOrEmpty(FixturePath("golden_" + name + ".json"));
      if (text.empty()) return nullptr;
      slot = std::make_unique<nlohmann::json>(nlohmann::json::parse(text));
    }
    return slot.get();
  }
  // HF-exact: tokenizer.json alone, as `tokenizers.Tokenizer.from_file`.
  const Tokenizer* tokenizer(const std::string& name) {
    auto& slot = tokenizers_[name];
    if (slot == nullptr) {
      auto loaded =
          Tokenizer::FromDirectory(TokenizerDir(name), {.apply_config_special_tokens = false});
      EXPECT_TRUE(loaded.ok()) << loaded.status();
      if (!loaded.ok()) return nullptr;
      slot = std::move(loaded).value();
    }
    return slot.get();
  }

 private:
  Shared() {
    texts_ = nlohmann::json::parse(ReadFileOrEmpty(FixturePath("corpus.json")))
                 .get<std::vector<std::string>>();
  }
  std::vector<std::string> texts_;
  std::map<std::string, std::unique_ptr<nlohmann::json>> goldens_;
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers_;
};

std::string Printable(const std::string& text) {
  std::string out = nlohmann::json(text).dump();
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = Shared::Get().golden(GetParam());
    ASSERT_NE(golden_, nullptr) << "missing " << FixturePath("golden_" + GetParam() + ".json");
    tokenizer_ = Shared::Get().tokenizer(GetParam());
    ASSERT_NE(tokenizer_, nullptr);
    ASSERT_EQ((*golden_)["num_texts"].get<size_t>(), Shared::Get().texts().size())
        << "corpus.json and the goldens are out of step; regenerate the goldens";
  }
  const nlohmann::json* golden_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
};

TEST(GoldenCorpusTest, HasEnoughVariedTexts) { EXPECT_GE(Shared::Get().texts().size(), 300u); }

TEST_P(GoldenTest, EncodeMatchesHuggingFaceIdForId) {
  const auto& texts = Shared::Get().texts();
  const auto& cases = (*golden_)["cases"];
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = cases[i]["ids"].get<std::vector<int32_t>>();
    auto ids = tokenizer_->Encode(texts[i], /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << i << " " << Printable(texts[i]) << "\n  expected "
                    << nlohmann::json(expected).dump() << "\n  got      "
                    << nlohmann::json(*ids).dump();
    }
    const auto expected_special = cases[i].contains("with_special")
                                      ? cases[i]["with_special"].get<std::vector<int32_t>>()
                                      : expected;
    auto with_special = tokenizer_->Encode(texts[i], /*add_special_tokens=*/true);
    ASSERT_TRUE(with_special.ok());
    if (*with_special != expected_special && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << i << " with special tokens differs";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(GoldenTest, DecodeMatchesHuggingFaceAndRoundTrips) {
  const auto& texts = Shared::Get().texts();
  const auto& cases = (*golden_)["cases"];
  int roundtrips = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& c = cases[i];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const std::string expected = c.contains("decoded") ? c["decoded"].get<std::string>() : texts[i];
    const std::string expected_skip =
        c.contains("decoded_skip") ? c["decoded_skip"].get<std::string>() : expected;
    const std::string decoded = tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
    EXPECT_EQ(decoded, expected) << "text " << i << " " << Printable(texts[i]);
    EXPECT_EQ(tokenizer_->Decode(ids, /*skip_special_tokens=*/true), expected_skip) << "text " << i;
    if (c["roundtrip"].get<bool>()) {
      EXPECT_EQ(decoded, texts[i]) << "HF round-trips text " << i;
      ++roundtrips;
    }
  }
  // Sanity: HF round-trips most of the corpus (Qwen NFC-normalizes, so not all).
  EXPECT_GT(roundtrips, static_cast<int>(texts.size() * 8 / 10));
}

TEST_P(GoldenTest, DecodesArbitraryIdSequencesLikeHuggingFace) {
  for (const auto& d : (*golden_)["decodes"]) {
    const auto ids = d["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer_->Decode(ids, false), d["text"].get<std::string>())
        << nlohmann::json(ids).dump();
    EXPECT_EQ(tokenizer_->Decode(ids, true), d["skip"].get<std::string>())
        << nlohmann::json(ids).dump();
  }
}

TEST_P(GoldenTest, StreamDecoderPiecesAreValidAndConcatenateToDecode) {
  auto check = [&](const std::vector<int32_t>& ids, bool skip) {
    StreamDecoder stream(*tokenizer_, {.skip_special_tokens = skip});
    std::string all;
    for (int32_t id : ids) {
      const std::string piece = stream.Step(id);
      EXPECT_FALSE(tokenizer_internal::FindInvalidUtf8(piece).has_value());
      all += piece;
    }
    all += stream.Finish();
    EXPECT_EQ(all, tokenizer_->Decode(ids, skip)) << nlohmann::json(ids).dump();
  };
  for (const auto& c : (*golden_)["cases"]) {
    check(c["ids"].get<std::vector<int32_t>>(), false);
    check(c["ids"].get<std::vector<int32_t>>(), true);
  }
  for (const auto& d : (*golden_)["decodes"]) check(d["ids"].get<std::vector<int32_t>>(), false);
}

TEST_P(GoldenTest, ConcurrentEncodesGiveTheSameIds) {
  const auto& texts = Shared::Get().texts();
  const auto& cases = (*golden_)["cases"];
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < texts.size() * 2; i += 2) {
        const size_t k = i % texts.size();
        auto ids = tokenizer_->Encode(texts[k], false);
        if (!ids.ok() || *ids != cases[k]["ids"].get<std::vector<int32_t>>()) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, GoldenTest,
                         ::testing::Values("qwen3", "llama3", "deepseek_v3"));

}  // namespace
}  // namespace ringserve
