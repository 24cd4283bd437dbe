// One request's output text as it streams: incremental detokenization (StreamDecoder, special
// tokens skipped) plus stop strings matched on the detokenized text. Text that could still be
// the beginning of a stop string is held back, so a matched stop string never reaches the
// client; text is never cut inside a UTF-8 sequence.
//
// Not thread-safe (one per request). Without a tokenizer every piece is empty and stop strings
// must be empty.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"

namespace ringserve {

class TextStream {
 public:
  // `tokenizer` may be null; it must outlive this object.
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings);

  struct Piece {
    std::string text;      // text to send now
    bool stopped = false;  // a stop string matched; `text` ends just before it
  };

  // Adds a generated token. `hidden`: the token ends the request and its text is not shown
  // (EOS or a stop token id).
  Piece Add(int32_t token, bool hidden);
  // The request ended (not by a stop string): returns the held-back text (checked for stop
  // strings once more).
  Piece Finish();

 private:
  Piece Cut(bool final_piece);

  std::optional<StreamDecoder> decoder_;
  std::vector<std::string> stops_;
  std::string buffer_;  // decoded, not yet sent
  bool stopped_ = false;
};

}  // namespace ringserve
