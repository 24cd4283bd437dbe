// Perplexity of a text through a running ring (gRPC Generate with prompt_logprobs), scored the
// same way as scripts/train_small_model.py scores it with transformers, so the two compare:
//   - the text is split into documents at blank lines ("\n\n"; empty documents dropped);
//   - each document is tokenized by the server with special tokens (BOS for the trained model);
//   - its ids are cut into windows of `window_tokens`; each window is one request, scored
//     alone: every token but the window's first, given the tokens before it in the window;
//   - perplexity = exp(sum of negative log-likelihoods / scored tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/generate.grpc.pb.h"

namespace ringserve::perplexity {

struct Options {
  int window_tokens = 512;  // >= 2; at most the model's context - 1
  int concurrency = 4;      // requests in flight
  int max_documents = 0;    // 0 = all
  int request_timeout_s = 600;
};

// One scored window: document index, first token's index within the document, tokens scored
// (window length - 1) and their summed negative log-likelihood (nats).
struct WindowScore {
  int document = 0;
  int start = 0;
  int scored = 0;
  double nll = 0;
};

struct Report {
  int documents = 0;
  std::vector<WindowScore> windows;  // document order, then start
  int64_t tokens = 0;                // scored
  double nll = 0;
  double perplexity = 0;
  double seconds = 0;
};

// Splits at "\n\n" after dropping the text's trailing newlines; drops empty documents.
std::vector<std::string> SplitDocuments(std::string_view text);

// [start, end) index pairs of the windows of a document of `num_tokens` ids (windows shorter
// than 2 tokens are dropped: nothing to score).
std::vector<std::pair<int, int>> Windows(int num_tokens, int window_tokens);

// Scores `text` through `stub`. Thread-safe stub required (gRPC stubs are). Errors name the
// document and window (a server without prompt log-probabilities, a window over the context).
absl::StatusOr<Report> Measure(v1::Generate::Stub& stub, std::string_view text,
                               const Options& options);

}  // namespace ringserve::perplexity
