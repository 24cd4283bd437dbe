// tokenizer.json files whose normalizers or decoders multiply text (a Replace of one character
// by a long string, repeated in a Sequence): Encode fails with InvalidArgument for that text
// instead of exhausting memory, the tokenizer keeps working for other text, and absurd
// literals or decoder chains are refused at load time naming their place in the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_spec_testing.h"

namespace ringserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using tokenizer_testing::BuildTokenizer;

// A byte-level BPE over the 256 byte characters (one merge, "h i") with `normalizer`.
json ByteLevelSpec(const json& normalizer, const json& decoder = {{"type", "ByteLevel"}}) {
  json vocab = tokenizer_testing::ByteLevelVocab();
  vocab["hi"] = 256;
  return {{"normalizer", normalizer},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", decoder},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"h i"})}}}};
}

json Replace(const std::string& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", {{"String", pattern}}}, {"content", content}};
}

json Sequence(std::vector<json> normalizers) {
  return {{"type", "Sequence"}, {"normalizers", normalizers}};
}

TEST(TokenizerGrowthTest, ChainedReplacesFailThatEncodeAndTheTokenizerKeepsWorking) {
  // Each step multiplies every "a" by 1,000: 10^15 bytes for one "a" after five steps.
  const std::string thousand(1000, 'a');
  auto t = BuildTokenizer(ByteLevelSpec(
      Sequence({Replace("a", thousand), Replace("a", thousand), Replace("a", thousand),
                Replace("a", thousand), Replace("a", thousand)})));
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode("a", /*add_special_tokens=*/true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << ids.status();
  // The third step would write 10^9 bytes: past the 1 MiB a short text may grow to.
  EXPECT_THAT(std::string(ids.status().message()),
              HasSubstr("normalizer.normalizers[2] (Replace) grows the text past 1048576 bytes"));
  // Text the chain leaves alone encodes, before and after the failure alike.
  for (int i = 0; i < 2; ++i) {
    auto hi = t->Encode("hi hi", true);
    ASSERT_TRUE(hi.ok()) << hi.status();
    EXPECT_EQ(*hi, (std::vector<int32_t>{256, ' ', 256}));
    EXPECT_FALSE(t->Encode("a", true).ok());
  }
}

TEST(TokenizerGrowthTest, TheBudgetScalesWithTheText) {
  // 100 times the text: within the 1 MiB floor for short text, past 64 times for long text.
  auto t = BuildTokenizer(ByteLevelSpec(Replace("a", std::string(100, 'b'))));
  ASSERT_NE(t, nullptr);
  auto short_text = t->Encode(std::string(1000, 'a'), false);
  ASSERT_TRUE(short_text.ok()) << short_text.status();
  EXPECT_EQ(short_text->size(), 100000u);
  auto long_text = t->Encode(std::string(100000, 'a'), false);
  EXPECT_EQ(long_text.status().code(), absl::StatusCode::kInvalidArgument) << long_text.status();
  EXPECT_THAT(std::string(long_text.status().message()),
              HasSubstr("for 100000 bytes of text (64 times the text"));
  // Growth a real file has (a space becomes the 3-byte "▁", a prefix added) fits any text.
  auto spaces = BuildTokenizer(ByteLevelSpec(
      Sequence({{{"type", "Prepend"}, {"prepend", "▁"}}, Replace(" ", "▁"), {{"type", "NFKC"}}})));
  ASSERT_NE(spaces, nullptr);
  // 256 KiB of spaces: the steps write 7 times that, past the 1 MiB floor.
  auto many = spaces->Encode(std::string(256 << 10, ' '), false);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->size(), 3u * ((256 << 10) + 1));
}

TEST(TokenizerGrowthTest, UnicodeNormalizationCountsAgainstTheBudget) {
  // U+FDFA decomposes to 18 characters (33 bytes) under NFKD: 60,000 bytes of it become
  // 660,000, twice, after the Replace wrote 60,000: past 1 MiB in the second NFKD.
  std::string ligatures;
  for (int i = 0; i < 20000; ++i) ligatures += "\xEF\xB7\xBA";
  auto t = BuildTokenizer(
      ByteLevelSpec(Sequence({Replace("x", ligatures), {{"type", "NFKD"}}, {{"type", "NFKD"}}})));
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode("x", false);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << ids.status();
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("normalizer.normalizers[2] (NFKD)"));
  EXPECT_TRUE(t->Encode("y", false).ok());
}

TEST(TokenizerGrowthTest, ReplaceFindsNonOverlappingOccurrencesInOnePass) {
  struct Case {
    std::string pattern, content, text, expected;
  };
  const Case cases[] = {
      {"aaa", "b", "aaaaaaa", "bba"},  // non-overlapping, left to right
      {"aba", "X", "ababa", "Xba"},
      {"aab", "X", "aaab", "aX"},  // a partial match falls back to a shorter one
      {"abcabd", "X", "abcabcabd", "abcX"},
      {"a", "", "banana", "bnn"},
  };
  for (const Case& c : cases) {
    auto t = BuildTokenizer(ByteLevelSpec(Replace(c.pattern, c.content)));
    ASSERT_NE(t, nullptr);
    auto ids = t->Encode(c.text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, std::vector<int32_t>(c.expected.begin(), c.expected.end())) << c.pattern;
  }
  // A 64 KiB pattern that almost matches everywhere: no occurrence, the text unchanged (the
  // search reads the text once; a naive one compares up to both lengths' product).
  auto t = BuildTokenizer(ByteLevelSpec(Replace(std::string(65535, 'a') + "b", "X")));
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode(std::string(200000, 'a'), false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), 200000u);
}

TEST(TokenizerGrowthTest, AbsurdLiteralsAreRefusedAtLoadNamingTheKey) {
  auto big = Tokenizer::FromJson(
      ByteLevelSpec(Sequence({{{"type", "NFC"}}, Replace("a", std::string(100000, 'a'))})).dump(),
      "", {});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_THAT(std::string(big.status().message()),
              HasSubstr("normalizer.normalizers[1] (Replace): 'content' is 100000 bytes, above "
                        "the limit of 65536 bytes"));
  auto prepend = Tokenizer::FromJson(
      ByteLevelSpec({{"type", "Prepend"}, {"prepend", std::string(70000, 'p')}}).dump(), "", {});
  EXPECT_THAT(std::string(prepend.status().message()),
              HasSubstr("normalizer (Prepend): 'prepend'"));
}

TEST(TokenizerGrowthTest, AddedTokensNormalizedAtLoadAreBoundedToo) {
  // A normalized added token goes through the normalizer when the file is loaded.
  const std::string thousand(1000, 'a');
  json spec = ByteLevelSpec(
      Sequence({Replace("a", thousand), Replace("a", thousand), Replace("a", thousand)}));
  spec["added_tokens"] =
      json::array({{{"id", 300}, {"content", "banana"}, {"special", false}, {"normalized", true}}});
  auto t = Tokenizer::FromJson(spec.dump(), "", {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("added token 300"));
}

TEST(TokenizerGrowthTest, DecoderChainsThatMultiplyTextAreRefusedAtLoad) {
  // Decode has no error path: such a chain would run out of memory on the generated text.
  json decoders = json::array();
  for (int i = 0; i < 5; ++i) decoders.push_back(Replace("a", std::string(1000, 'a')));
  auto t = Tokenizer::FromJson(
      ByteLevelSpec(nullptr, {{"type", "Sequence"}, {"decoders", decoders}}).dump(), "", {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("decoder.decoders[0] (Replace)"));
  // SentencePiece's decoder Replace shrinks text and loads.
  EXPECT_NE(
      BuildTokenizer(ByteLevelSpec(
          nullptr, {{"type", "Sequence"},
                    {"decoders", {Replace("▁", " "), Replace("ab", "abab"), {{"type", "Fuse"}}}}})),
      nullptr);
}

}  // namespace
}  // namespace ringserve
