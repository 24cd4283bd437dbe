#include "coordinator/text_stream.h"

#include <algorithm>

namespace ringserve {

TextStream::TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings)
    : stops_(std::move(stop_strings)) {
  if (tokenizer != nullptr) {
    decoder_.emplace(*tokenizer, StreamDecoder::Options{.skip_special_tokens = true});
  }
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

TextStream::Piece TextStream::Add(int32_t token, bool hidden) {
  if (stopped_ || !decoder_) return {};
  std::string piece = decoder_->Step(token);
  if (!hidden) buffer_ += piece;
  return Cut(/*final_piece=*/false);
}

TextStream::Piece TextStream::Finish() {
  if (stopped_ || !decoder_) return {};
  buffer_ += decoder_->Finish();
  return Cut(/*final_piece=*/true);
}

TextStream::Piece TextStream::Cut(bool final_piece) {
  Piece out;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, buffer_.find(stop));
  if (first != std::string::npos) {
    out.text = buffer_.substr(0, first);
    out.stopped = true;
    stopped_ = true;
    buffer_.clear();
    return out;
  }
  size_t cut = buffer_.size();
  if (!final_piece) {
    // Hold back the longest tail that is the beginning of some stop string.
    size_t hold = 0;
    for (const std::string& stop : stops_) {
      for (size_t k = std::min(stop.size() - 1, buffer_.size()); k > hold; --k) {
        if (buffer_.compare(buffer_.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    cut -= hold;
    while (cut > 0 && (static_cast<unsigned char>(buffer_[cut]) & 0xC0) == 0x80) --cut;
  }
  out.text = buffer_.substr(0, cut);
  buffer_.erase(0, cut);
  return out;
}

}  // namespace ringserve
