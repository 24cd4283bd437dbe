#include "bench/perplexity/perplexity.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "fmt/format.h"

namespace ringserve::perplexity {
namespace {

struct Job {
  int document = 0;
  int start = 0;
  std::vector<int32_t> ids;
};

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      fmt::format("{}: {}", what, status.error_message()));
}

// One window as one request: the window's ids as the prompt, one greedy token, prompt
// log-probabilities on.
absl::StatusOr<WindowScore> ScoreWindow(v1::Generate::Stub& stub, const Job& job,
                                        const Options& options) {
  const std::string where = fmt::format("document {} window at token {}", job.document, job.start);
  v1::GenerateRequest request;
  request.set_request_id(fmt::format("ppl-{}-{}", job.document, job.start));
  request.mutable_token_ids()->mutable_ids()->Add(job.ids.begin(), job.ids.end());
  request.set_prompt_logprobs(true);
  request.mutable_sampling()->set_max_tokens(1);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(options.request_timeout_s));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub.Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<float> logprobs;
  while (reader->Read(&response)) {
    if (!response.error().empty()) {
      return absl::InternalError(fmt::format("{}: {}", where, response.error()));
    }
    logprobs.insert(logprobs.end(), response.prompt_logprobs().begin(),
                    response.prompt_logprobs().end());
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status, where);
  const int expected = static_cast<int>(job.ids.size()) - 1;
  if (static_cast<int>(logprobs.size()) != expected) {
    return absl::FailedPreconditionError(
        fmt::format("{}: the server returned {} prompt log-probabilities for {} tokens (does it "
                    "support prompt_logprobs?)",
                    where, logprobs.size(), expected));
  }
  WindowScore score{.document = job.document, .start = job.start, .scored = expected};
  for (float lp : logprobs) {
    if (!std::isfinite(lp)) {
      return absl::InternalError(fmt::format("{}: a log-probability is {}", where, lp));
    }
    score.nll -= lp;
  }
  return score;
}

}  // namespace

std::vector<std::string> SplitDocuments(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  std::vector<std::string> docs;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = text.find("\n\n", pos);
    if (next == std::string_view::npos) next = text.size();
    if (next > pos) docs.emplace_back(text.substr(pos, next - pos));
    pos = next + 2;
  }
  return docs;
}

std::vector<std::pair<int, int>> Windows(int num_tokens, int window_tokens) {
  std::vector<std::pair<int, int>> out;
  for (int start = 0; start < num_tokens; start += window_tokens) {
    const int end = std::min(num_tokens, start + window_tokens);
    if (end - start >= 2) out.emplace_back(start, end);
  }
  return out;
}

absl::StatusOr<Report> Measure(v1::Generate::Stub& stub, std::string_view text,
                               const Options& options) {
  if (options.window_tokens < 2) {
    return absl::InvalidArgumentError(
        fmt::format("window_tokens must be >= 2, got {}", options.window_tokens));
  }
  const auto start_time = std::chrono::steady_clock::now();
  std::vector<std::string> docs = SplitDocuments(text);
  if (options.max_documents > 0 && static_cast<int>(docs.size()) > options.max_documents) {
    docs.resize(options.max_documents);
  }
  if (docs.empty()) return absl::InvalidArgumentError("the text has no documents");
  std::vector<Job> jobs;
  for (size_t d = 0; d < docs.size(); ++d) {
    v1::TokenizeRequest request;
    request.set_text(docs[d]);
    request.set_add_special_tokens(true);
    v1::TokenizeResponse response;
    grpc::ClientContext context;
    grpc::Status status = stub.Tokenize(&context, request, &response);
    if (!status.ok()) return FromGrpc(status, fmt::format("tokenizing document {}", d));
    const std::vector<int32_t> ids(response.token_ids().begin(), response.token_ids().end());
    for (auto [begin, end] : Windows(static_cast<int>(ids.size()), options.window_tokens)) {
      jobs.push_back(Job{.document = static_cast<int>(d),
                         .start = begin,
                         .ids = std::vector<int32_t>(ids.begin() + begin, ids.begin() + end)});
    }
  }

  std::vector<absl::StatusOr<WindowScore>> scores(jobs.size(), absl::UnknownError("not scored"));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  const int threads = std::max(1, std::min<int>(options.concurrency, jobs.size()));
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < jobs.size() && !failed; i = next++) {
        scores[i] = ScoreWindow(stub, jobs[i], options);
        if (!scores[i].ok()) failed = true;
      }
    });
  }
  for (std::thread& w : workers) w.join();

  Report report;
  report.documents = static_cast<int>(docs.size());
  for (absl::StatusOr<WindowScore>& score : scores) {
    if (!score.ok()) {
      if (score.status().message() == "not scored") continue;  // skipped after a failure
      return score.status();
    }
    report.tokens += score->scored;
    report.nll += score->nll;
    report.windows.push_back(*score);
  }
  if (report.windows.size() != jobs.size()) {
    return absl::InternalError("some windows were not scored");
  }
  report.perplexity = std::exp(report.nll / static_cast<double>(report.tokens));
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return report;
}

}  // namespace ringserve::perplexity
