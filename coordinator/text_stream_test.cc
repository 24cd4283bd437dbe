#include "coordinator/text_stream.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

// Loaded once: parsing the 151k-token vocabulary dominates this test's time.
const Tokenizer* Qwen3() {
  static const Tokenizer* tokenizer = [] {
    const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
    std::string dir = std::string(root ? root : ".") + "/.deps/tokenizers/qwen3";
    auto loaded = Tokenizer::FromDirectory(dir);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? loaded->release() : nullptr;
  }();
  return tokenizer;
}

struct Streamed {
  std::string text;
  bool stopped = false;
  int pieces_after_stop = 0;
};

Streamed Stream(const Tokenizer& tokenizer, const std::string& input,
                std::vector<std::string> stops) {
  auto ids = tokenizer.Encode(input, false);
  EXPECT_TRUE(ids.ok());
  TextStream stream(&tokenizer, std::move(stops));
  Streamed out;
  for (int32_t id : *ids) {
    TextStream::Piece piece = stream.Add(id, false);
    if (out.stopped && !piece.text.empty()) out.pieces_after_stop++;
    out.text += piece.text;
    out.stopped = out.stopped || piece.stopped;
  }
  if (!out.stopped) {
    TextStream::Piece tail = stream.Finish();
    out.text += tail.text;
    out.stopped = tail.stopped;
  }
  return out;
}

TEST(TextStreamTest, WithoutStopsReproducesTheText) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_TRUE(tokenizer);
  std::string input = "Grüße aus Köln — 東京 🚀 and plain ASCII.";
  Streamed out = Stream(*tokenizer, input, {});
  EXPECT_EQ(out.text, input);
  EXPECT_FALSE(out.stopped);
}

TEST(TextStreamTest, StopStringIsCutAndNotLeaked) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_TRUE(tokenizer);
  Streamed out = Stream(*tokenizer, "The answer is 42.\n\nQuestion: what next", {"\n\nQuestion:"});
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.text, "The answer is 42.");
  EXPECT_EQ(out.pieces_after_stop, 0);
}

TEST(TextStreamTest, EarliestOfSeveralStopsWins) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_TRUE(tokenizer);
  Streamed out = Stream(*tokenizer, "alpha beta gamma delta", {"delta", "beta"});
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.text, "alpha ");
}

TEST(TextStreamTest, PartialStopPrefixIsReleasedAtTheEnd) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_TRUE(tokenizer);
  // "END" never completes; the held-back "EN" must come out at Finish.
  Streamed out = Stream(*tokenizer, "the story ends with EN", {"END"});
  EXPECT_FALSE(out.stopped);
  EXPECT_EQ(out.text, "the story ends with EN");
}

TEST(TextStreamTest, HiddenTokenTextIsNotShown) {
  const Tokenizer* tokenizer = Qwen3();
  ASSERT_TRUE(tokenizer);
  auto ids = tokenizer->Encode("hello there", false);
  ASSERT_TRUE(ids.ok());
  TextStream stream(tokenizer, {});
  std::string text;
  for (size_t i = 0; i + 1 < ids->size(); ++i) text += stream.Add((*ids)[i], false).text;
  text += stream.Add(ids->back(), /*hidden=*/true).text;
  text += stream.Finish().text;
  EXPECT_EQ(text, "hello");
}

TEST(TextStreamTest, NoTokenizerGivesNoText) {
  TextStream stream(nullptr, {});
  EXPECT_EQ(stream.Add(5, false).text, "");
  EXPECT_EQ(stream.Finish().text, "");
}

}  // namespace
}  // namespace ringserve
