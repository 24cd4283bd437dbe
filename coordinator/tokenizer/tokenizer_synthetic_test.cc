// Small hand-built tokenizer.json files: refused files name what is wrong, and the parts the
// real files do not exercise (Split behaviors, Digits, added-token flags, byte fallback,
// TemplateProcessing, decoders) behave as in Hugging Face.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_spec_testing.h"

namespace ringserve {
namespace {

using nlohmann::json;
using tokenizer_testing::BuildTokenizer;

// A byte-level BPE over the 256 byte characters plus a few merges ("Ġh"+"i" etc.).
json ByteLevelSpec() {
  json vocab = tokenizer_testing::ByteLevelVocab();
  vocab["hi"] = 256;
  vocab["Ġhi"] = 257;
  vocab["12"] = 258;
  vocab["ab"] = 259;
  vocab["abc"] = 260;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 300},
                                     {"content", "<s>"},
                                     {"special", true},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"single_word", false},
                                     {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"h i", "Ġ hi", "1 2", "a b", "ab c"})}}},
  };
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text, bool special = false) {
  auto ids = t.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

void ExpectRefused(const std::string& tokenizer_json, const std::string& needle) {
  auto tokenizer = Tokenizer::FromJson(tokenizer_json, "", {});
  ASSERT_FALSE(tokenizer.ok()) << "expected refusal mentioning " << needle;
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tokenizer.status().message().find(needle), std::string::npos)
      << tokenizer.status().message();
}

TEST(SyntheticTokenizerTest, BaseSpecEncodesAndDecodes) {
  auto t = BuildTokenizer(ByteLevelSpec());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi hi"), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(Ids(*t, "abc<s>ab"), (std::vector<int32_t>{260, 300, 259}));
  EXPECT_EQ(t->Decode({260, 300, 259}, false), "abc<s>ab");
  EXPECT_EQ(t->Decode({260, 300, 259}, true), "abcab");
  EXPECT_EQ(t->Decode({0xC3, 999999, -5}, false), "\xEF\xBF\xBD");  // lone lead byte; unknown ids
}

TEST(SyntheticTokenizerTest, RefusesBadJson) {
  ExpectRefused("{\"model\": ", "invalid JSON");
  ExpectRefused("[1, 2]", "missing 'model'");
}

TEST(SyntheticTokenizerTest, RefusesUnsupportedModels) {
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    json spec = ByteLevelSpec();
    spec["model"]["type"] = type;
    ExpectRefused(spec.dump(), std::string("unsupported model type '") + type + "'");
  }
}

TEST(SyntheticTokenizerTest, RefusesUnknownPartsNamingThem) {
  json spec = ByteLevelSpec();
  spec["pre_tokenizer"] = {{"type", "Whitespacey"}};
  ExpectRefused(spec.dump(), "unsupported pre_tokenizer type 'Whitespacey'");
  spec = ByteLevelSpec();
  spec["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Precompiled"}}}}};
  ExpectRefused(spec.dump(), "unsupported normalizer type 'Precompiled'");
  spec = ByteLevelSpec();
  spec["decoder"] = {{"type", "CTC"}};
  ExpectRefused(spec.dump(), "unsupported decoder type 'CTC'");
  spec = ByteLevelSpec();
  spec["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectRefused(spec.dump(), "unsupported post_processor type 'RobertaProcessing'");
}

TEST(SyntheticTokenizerTest, RefusesRegexThatPcre2Rejects) {
  json spec = ByteLevelSpec();
  spec["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "(?i:'s|\\p{L}+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  ExpectRefused(spec.dump(), "regex rejected by PCRE2");
}

TEST(SyntheticTokenizerTest, RefusesMergesNamingUnknownTokens) {
  json spec = ByteLevelSpec();
  spec["model"]["merges"].push_back("zz qq");
  ExpectRefused(spec.dump(), "names a token that is not in the vocab");
  spec = ByteLevelSpec();
  spec["model"]["merges"].push_back("a b c");
  ExpectRefused(spec.dump(), "is not two tokens");
}

// Per-id tables are sized by the largest id: ids past kMaxTokenId (vocab or added tokens) are
// refused instead of aborting on a 2^31-entry allocation, and 2^32 + 5 is not wrapped to 5.
TEST(SyntheticTokenizerTest, RefusesHugeTokenIds) {
  for (const int64_t id : {int64_t{1} << 30, int64_t{INT32_MAX}, int64_t{1} << 40}) {
    json spec = ByteLevelSpec();
    spec["model"]["vocab"]["zz"] = id;
    ExpectRefused(spec.dump(), "vocab entry 'zz' has no valid id (0 to 4194303)");
  }
  for (const int64_t id :
       {int64_t{1} << 30, int64_t{INT32_MAX}, (int64_t{1} << 32) + 5, int64_t{-1}}) {
    json spec = ByteLevelSpec();
    spec["added_tokens"][0]["id"] = id;
    ExpectRefused(spec.dump(), "added token id " + std::to_string(id) + " is outside [0, 4194303]");
  }
  json spec = ByteLevelSpec();
  spec["added_tokens"][0]["id"] = 100000;
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "ab<s>", /*special=*/true), (std::vector<int32_t>{259, 100000}));
}

TEST(SyntheticTokenizerTest, MergesMayBePairs) {
  json spec = ByteLevelSpec();
  spec["model"]["merges"] = json::array({{"h", "i"}, {"Ġ", "hi"}});
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi hi"), (std::vector<int32_t>{256, 257}));
}

json SplitThenByteLevel(const std::string& regex, const std::string& behavior, bool invert) {
  json spec = ByteLevelSpec();
  spec["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", regex}}},
         {"behavior", behavior},
         {"invert", invert}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return spec;
}

TEST(SyntheticTokenizerTest, SplitBehaviorsFollowHuggingFace) {
  // Without merges between pieces, "ab" is 259 only when a and b share a pre-token.
  auto ids = [](const std::string& behavior, bool invert, const std::string& text) {
    auto t = BuildTokenizer(SplitThenByteLevel("b", behavior, invert));
    return t ? Ids(*t, text) : std::vector<int32_t>{};
  };
  const int a = 'a', b = 'b', c = 'c';
  EXPECT_EQ(ids("Isolated", false, "abc"), (std::vector<int32_t>{a, b, c}));
  EXPECT_EQ(ids("Removed", false, "abc"), (std::vector<int32_t>{a, c}));
  EXPECT_EQ(ids("MergedWithPrevious", false, "abc"), (std::vector<int32_t>{259, c}));
  EXPECT_EQ(ids("MergedWithNext", false, "abc"), (std::vector<int32_t>{a, 'b', c}));
  EXPECT_EQ(ids("MergedWithNext", false, "cabc"), (std::vector<int32_t>{c, a, 'b', c}));
  EXPECT_EQ(ids("Contiguous", false, "abbc"), (std::vector<int32_t>{a, b, b, c}));
  // invert: "b" pieces are the non-matches, so Removed drops everything but "b".
  EXPECT_EQ(ids("Removed", true, "abcb"), (std::vector<int32_t>{b, b}));
}

TEST(SyntheticTokenizerTest, EmptyMatchRightAfterAMatchIsSkippedLikeOniguruma) {
  // Hugging Face iterates Split regexes with the onig crate, which drops an empty match that
  // starts where the previous match ended: "a*" on "aab" matches "aa" and the empty string at
  // the end, not at offset 2, so MergedWithNext keeps "aab" whole (a, ab).
  auto t = BuildTokenizer(SplitThenByteLevel("a*", "MergedWithNext", false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "aab"), (std::vector<int32_t>{'a', 259}));
}

TEST(SyntheticTokenizerTest, DigitsSplitIndividuallyOrInRuns) {
  for (bool individual : {true, false}) {
    json spec = ByteLevelSpec();
    spec["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", individual}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    auto t = BuildTokenizer(spec);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(Ids(*t, "x12"), individual ? (std::vector<int32_t>{'x', '1', '2'})
                                         : (std::vector<int32_t>{'x', 258}));
  }
}

TEST(SyntheticTokenizerTest, ByteLevelAddPrefixSpace) {
  json spec = ByteLevelSpec();
  spec["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi"), (std::vector<int32_t>{257}));
  EXPECT_EQ(Ids(*t, " hi"), (std::vector<int32_t>{257}));
}

TEST(SyntheticTokenizerTest, AddedTokenFlags) {
  json spec = ByteLevelSpec();
  spec["added_tokens"] = json::array({{{"id", 301},
                                       {"content", "[L]"},
                                       {"special", false},
                                       {"lstrip", true},
                                       {"rstrip", false},
                                       {"single_word", false},
                                       {"normalized", false}},
                                      {{"id", 302},
                                       {"content", "[R]"},
                                       {"special", false},
                                       {"lstrip", false},
                                       {"rstrip", true},
                                       {"single_word", false},
                                       {"normalized", false}},
                                      {{"id", 303},
                                       {"content", "ab"},
                                       {"special", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"single_word", true},
                                       {"normalized", true}}});
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  const int sp = 0x20;  // byte-level id of ' ' in this vocab
  EXPECT_EQ(Ids(*t, "c  [L]c"), (std::vector<int32_t>{'c', 301, 'c'}));
  EXPECT_EQ(Ids(*t, "c[R]  c"), (std::vector<int32_t>{'c', 302, 'c'}));
  EXPECT_EQ(Ids(*t, "ab c"), (std::vector<int32_t>{303, sp, 'c'}));
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{260}));  // not a single word: BPE
}

TEST(SyntheticTokenizerTest, SingleWordBoundariesAreRegexWordCharacters) {
  // Hugging Face checks single_word with Rust regex's \w: Alphabetic, marks, decimal digits,
  // connector punctuation and joiners, but not other numbers such as '²'.
  json spec = ByteLevelSpec();
  spec["added_tokens"] = json::array({{{"id", 303},
                                       {"content", "ab"},
                                       {"special", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"single_word", true},
                                       {"normalized", false}}});
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  // U+0301 (a combining mark) and U+203F (connector punctuation) continue the word: BPE.
  EXPECT_EQ(Ids(*t, "ab\u0301"), (std::vector<int32_t>{259, 0xCC, 0x81}));
  EXPECT_EQ(Ids(*t, "ab\u203F"), (std::vector<int32_t>{259, 0xE2, 0x80, 0xBF}));
  EXPECT_EQ(Ids(*t, "ab\u200D"), (std::vector<int32_t>{259, 0xE2, 0x80, 0x8D}));
  // U+00B2 (superscript two, a number but not a decimal digit) does not: the added token.
  EXPECT_EQ(Ids(*t, "\u00B2ab"), (std::vector<int32_t>{0xC2, 0xB2, 303}));
}

TEST(SyntheticTokenizerTest, TemplateProcessingAddsBosAndEos) {
  json spec = ByteLevelSpec();
  spec["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}};
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "hi", true), (std::vector<int32_t>{300, 256, 300}));
  EXPECT_EQ(Ids(*t, "hi", false), (std::vector<int32_t>{256}));
}

TEST(SyntheticTokenizerTest, ConfigAddBosToken) {
  auto t = BuildTokenizer(ByteLevelSpec(),
                          R"({"bos_token": {"content": "<s>"}, "add_bos_token": true})");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos_token_id(), 300);
  EXPECT_EQ(Ids(*t, "hi", true), (std::vector<int32_t>{300, 256}));
}

TEST(SyntheticTokenizerTest, ByteFallbackAndSentencePieceStyleDecoders) {
  // A Llama-2-style (non-byte-level) BPE: unknown characters fall back to <0xXX> tokens.
  json vocab = {{"<unk>", 0}, {"▁", 1}, {"a", 2}, {"b", 3}, {"▁a", 4}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 10 + b;
  }
  json spec = {{"normalizer",
                {{"type", "Sequence"},
                 {"normalizers",
                  {{{"type", "Prepend"}, {"prepend", "▁"}},
                   {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
               {"pre_tokenizer", nullptr},
               {"decoder",
                {{"type", "Sequence"},
                 {"decoders",
                  {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}},
                   {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
               {"model",
                {{"type", "BPE"},
                 {"vocab", vocab},
                 {"merges", json::array({"▁ a"})},
                 {"unk_token", "<unk>"},
                 {"byte_fallback", true}}}};
  auto t = BuildTokenizer(spec);
  ASSERT_NE(t, nullptr);
  // "a é" -> ▁a ▁ <0xC3> <0xA9>
  const std::vector<int32_t> expected = {4, 1, 10 + 0xC3, 10 + 0xA9};
  EXPECT_EQ(Ids(*t, "a é"), expected);
  EXPECT_EQ(t->Decode(expected, false), "a é");
  EXPECT_EQ(t->Decode({4, 10 + 0xC3}, false), "a\xEF\xBF\xBD");
  // Streaming through a non-byte-level decoder still concatenates to the full decode.
  StreamDecoder stream(*t);
  std::string all;
  for (int32_t id : expected) all += stream.Step(id);
  all += stream.Finish();
  EXPECT_EQ(all, "a é");
}

TEST(SyntheticTokenizerTest, StreamDecoderHoldsBackIncompleteCharacters) {
  auto t = BuildTokenizer(ByteLevelSpec());
  ASSERT_NE(t, nullptr);
  StreamDecoder stream(*t);
  // U+1F600 is F0 9F 98 80: nothing comes out until the last byte.
  EXPECT_EQ(stream.Step(0xF0), "");
  EXPECT_EQ(stream.Step(0x9F), "");
  EXPECT_EQ(stream.Step(0x98), "");
  EXPECT_EQ(stream.Step(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.Step('h'), "h");
  // A truncated sequence is flushed as U+FFFD by Finish, as Decode shows it.
  EXPECT_EQ(stream.Step(0xE2), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");
  // An invalid byte is emitted at once as U+FFFD.
  EXPECT_EQ(stream.Step(0xFF), "\xEF\xBF\xBD");
}

TEST(SyntheticTokenizerTest, MissingDirectoryIsNotFound) {
  auto t = Tokenizer::FromDirectory("/nonexistent/tokenizer/dir");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ringserve
