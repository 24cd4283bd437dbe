// `ringserve_client`: a command-line client for the gRPC Generate API.
//
//   ringserve_client [--target HOST:PORT] --prompt "Once upon a time" [--max_tokens N]
//       [--temperature T] [--top_k K] [--top_p P] [--seed S] [--stop A,B] [--ignore_eos]
//       [--min_tokens N] [--top_logprobs K] [--n N]
//   ringserve_client --prompt_ids 1,2,3 ...      token ids instead of text
//   ringserve_client --info | --stats | --health | --tokenize "text"
//
// Streams the generated text to stdout (token ids, when the model has no tokenizer); the
// finish reason, usage (summed over the choices) and, with --top_logprobs, each token's
// log-probabilities go to stderr. Exit code 0 on success, 1 on an error.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/bounded_file.h"
#include "common/flags.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "proto/generate.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "HOST:PORT of the coordinator's gRPC API");
ABSL_FLAG(std::string, server, "", "old spelling of --target (overrides it when set)");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as token ids, e.g. 1,2,3 (instead of --prompt)");
ABSL_FLAG(int, max_tokens, 0, "output tokens (0: the server's default)");
ABSL_FLAG(double, temperature, 0, "sampling temperature (0: greedy)");
ABSL_FLAG(int, top_k, 0, "top-k (0: off)");
ABSL_FLAG(double, top_p, 0, "top-p (0 or 1: off)");
ABSL_FLAG(std::string, seed, "", "sampling seed (empty: the server picks)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(std::vector<std::string>, stop_token_id, {}, "stop token ids, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "generate max_tokens whatever comes");
ABSL_FLAG(int, min_tokens, 0, "EOS and stop ids are not sampled before this many tokens");
ABSL_FLAG(int, top_logprobs, -1,
          "print each token's logprob and this many alternatives to stderr (-1: off)");
ABSL_FLAG(int, n, 1, "choices (printed one after another once all finished)");
ABSL_FLAG(bool, special_tokens, true,
          "add the tokenizer's special tokens (BOS) to a text prompt; --nospecial_tokens: not");
ABSL_FLAG(std::string, request_id, "", "request id, without '#' (empty: the server makes one up)");
ABSL_FLAG(bool, print_ids, false, "print token ids instead of text");
ABSL_FLAG(bool, info, false, "print the model info and exit");
ABSL_FLAG(bool, stats, false, "print the server's stats and exit");
ABSL_FLAG(bool, health, false, "check the server's health and exit");
ABSL_FLAG(std::string, tokenize, "", "tokenize this text and exit");
ABSL_FLAG(std::string, api_key_file, "",
          "a file holding the server's API key (sent as a bearer token)");

namespace {

constexpr char kUsage[] =
    "A command-line client for the gRPC Generate API.\n"
    "usage: ringserve_client [--target=HOST:PORT] (--prompt=TEXT | --prompt_ids=1,2,3)\n"
    "         [--max_tokens=N] [--temperature=T] [--top_k=K] [--top_p=P] [--seed=S] ...\n"
    "         [--api_key_file=PATH]\n"
    "       ringserve_client [--target=HOST:PORT] --info | --stats | --health | --tokenize=TEXT";

int Fail(const std::string& message) {
  std::fprintf(stderr, "ringserve_client: %s\n", message.c_str());
  return 1;
}

const char* FinishName(ringserve::v1::FinishReason reason) {
  switch (reason) {
    case ringserve::v1::FINISH_REASON_STOP:
      return "stop";
    case ringserve::v1::FINISH_REASON_LENGTH:
      return "length";
    case ringserve::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case ringserve::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace v1 = ringserve::v1;
  std::string server;
  std::string mode = "generate";
  std::string tokenize_text;
  bool print_ids = false;
  v1::GenerateRequest request;
  request.set_add_special_tokens(true);
  v1::SamplingParams* sampling = request.mutable_sampling();
  ringserve::ParseCommandLineFlags(argc, argv, kUsage);
  server = absl::GetFlag(FLAGS_target);
  if (!absl::GetFlag(FLAGS_server).empty()) server = absl::GetFlag(FLAGS_server);
  if (!absl::GetFlag(FLAGS_prompt).empty()) request.set_text(absl::GetFlag(FLAGS_prompt));
  if (const std::string ids_text = absl::GetFlag(FLAGS_prompt_ids); !ids_text.empty()) {
    v1::TokenIds* ids = request.mutable_token_ids();
    for (absl::string_view part : absl::StrSplit(ids_text, ',', absl::SkipWhitespace())) {
      int id = 0;
      if (!absl::SimpleAtoi(part, &id)) return Fail("--prompt_ids: not a list of integers");
      ids->add_ids(id);
    }
  }
  std::string api_key;
  if (const std::string key_file = absl::GetFlag(FLAGS_api_key_file); !key_file.empty()) {
    absl::StatusOr<std::string> text =
        ringserve::ReadBoundedFile(key_file, ringserve::kMaxKeyFileBytes);
    if (!text.ok()) return Fail("--api_key_file: " + std::string(text.status().message()));
    api_key = text->substr(0, text->find('\n'));
    while (!api_key.empty() && std::isspace(static_cast<unsigned char>(api_key.back()))) {
      api_key.pop_back();
    }
    if (api_key.empty()) return Fail("--api_key_file: cannot read a key from the file");
  }
  sampling->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sampling->set_top_k(absl::GetFlag(FLAGS_top_k));
  sampling->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  if (const std::string seed = absl::GetFlag(FLAGS_seed); !seed.empty()) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(seed, &value)) return Fail("--seed: not a non-negative integer");
    sampling->set_seed(value);
  }
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) sampling->add_stop(stop);
  for (const std::string& id_text : absl::GetFlag(FLAGS_stop_token_id)) {
    int id = 0;
    if (!absl::SimpleAtoi(id_text, &id)) return Fail("--stop_token_id: not a list of integers");
    sampling->add_stop_token_ids(id);
  }
  sampling->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  sampling->set_min_tokens(absl::GetFlag(FLAGS_min_tokens));
  if (absl::GetFlag(FLAGS_top_logprobs) >= 0) {
    sampling->set_logprobs(true);
    sampling->set_top_logprobs(absl::GetFlag(FLAGS_top_logprobs));
  }
  request.set_n(absl::GetFlag(FLAGS_n));
  request.set_add_special_tokens(absl::GetFlag(FLAGS_special_tokens));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  print_ids = absl::GetFlag(FLAGS_print_ids);
  if (absl::GetFlag(FLAGS_info)) mode = "info";
  if (absl::GetFlag(FLAGS_stats)) mode = "stats";
  if (absl::GetFlag(FLAGS_health)) mode = "health";
  if (!absl::GetFlag(FLAGS_tokenize).empty()) {
    mode = "tokenize";
    tokenize_text = absl::GetFlag(FLAGS_tokenize);
  }

  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = v1::Generate::NewStub(channel);
  grpc::ClientContext context;
  if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
  if (mode == "info") {
    v1::ModelInfoResponse info;
    grpc::Status status = stub->ModelInfo(&context, v1::ModelInfoRequest(), &info);
    if (!status.ok()) return Fail(fmt::format("{}: {}", server, status.error_message()));
    std::printf("%s", info.DebugString().c_str());
    return 0;
  }
  if (mode == "stats") {
    v1::StatsResponse stats;
    grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &stats);
    if (!status.ok()) return Fail(fmt::format("{}: {}", server, status.error_message()));
    for (const auto& s : stats.stages()) {
      std::printf(
          "stage %d %s layers [%d, %d): busy %.1f%%, mean step %.3f ms, steps %lld, in flight %d, "
          "KV %lld/%lld blocks, sent %lld bytes, %s\n",
          s.index(), s.endpoint().c_str(), s.first_layer(), s.last_layer(),
          100.0 * s.busy_fraction(), s.mean_step_ms(), static_cast<long long>(s.steps()),
          s.micro_batches_in_flight(), static_cast<long long>(s.kv_blocks_used()),
          static_cast<long long>(s.kv_blocks_total()), static_cast<long long>(s.bytes_sent()),
          s.load_status().c_str());
    }
    std::printf(
        "requests: %lld finished, %lld failed, %lld cancelled, %d running, %d queued; %lld prompt "
        "+ %lld generated tokens, %.1f tok/s; mean queue %.2f ms, TTFT %.2f ms, inter-token "
        "%.2f ms\n",
        static_cast<long long>(stats.requests_finished()),
        static_cast<long long>(stats.requests_failed()),
        static_cast<long long>(stats.requests_cancelled()), stats.running(), stats.queue_depth(),
        static_cast<long long>(stats.prompt_tokens()),
        static_cast<long long>(stats.generated_tokens()), stats.tokens_per_second(),
        stats.mean_queue_ms(), stats.mean_ttft_ms(), stats.mean_inter_token_ms());
    std::printf("plan-ahead: %lld decodes planned ahead, %lld of their tokens discarded\n",
                static_cast<long long>(stats.ahead_decodes()),
                static_cast<long long>(stats.ahead_discarded()));
    return 0;
  }
  if (mode == "health") {
    v1::HealthResponse health;
    grpc::Status status = stub->Health(&context, v1::HealthRequest(), &health);
    if (!status.ok()) return Fail(fmt::format("{}: {}", server, status.error_message()));
    std::printf("%s: %s\n", health.serving() ? "serving" : "not serving", health.message().c_str());
    return health.serving() ? 0 : 1;
  }
  if (mode == "tokenize") {
    v1::TokenizeRequest t;
    t.set_text(tokenize_text);
    t.set_add_special_tokens(request.add_special_tokens());
    v1::TokenizeResponse response;
    grpc::Status status = stub->Tokenize(&context, t, &response);
    if (!status.ok()) return Fail(fmt::format("{}: {}", server, status.error_message()));
    for (int i = 0; i < response.token_ids_size(); ++i) {
      std::printf("%s%d", i ? "," : "", response.token_ids(i));
    }
    std::printf("\n");
    return 0;
  }
  if (request.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  v1::GenerateResponse last;
  std::vector<int> ids;
  bool any_text = false;
  const bool several = request.n() > 1;
  std::map<int, std::string> choices;  // with n > 1: printed at the end
  int completion_tokens = 0;
  while (reader->Read(&response)) {
    if (!response.text().empty()) any_text = true;
    if (several) {
      choices[response.index()] += response.text();
    } else {
      std::fputs(response.text().c_str(), stdout);
      std::fflush(stdout);
    }
    for (int id : response.token_ids()) ids.push_back(id);
    for (const v1::TokenLogprob& lp : response.logprobs()) {
      std::string top;
      for (int k = 0; k < lp.top_token_ids_size() && k < lp.top_logprobs_size(); ++k) {
        top += fmt::format(" {}:{:.4f}", lp.top_token_ids(k), lp.top_logprobs(k));
      }
      std::fprintf(stderr, "[choice %d token %d logprob %.4f%s%s]\n", response.index(),
                   lp.token_id(), lp.logprob(), top.empty() ? "" : " top", top.c_str());
    }
    if (response.finished()) completion_tokens += response.usage().completion_tokens();
    last = response;
  }
  for (const auto& [index, text] : choices) {
    std::printf("[choice %d]\n%s\n", index, text.c_str());
  }
  last.mutable_usage()->set_completion_tokens(completion_tokens);
  grpc::Status status = reader->Finish();
  if (!any_text || print_ids) {
    std::printf("%s[token ids:", any_text ? "\n" : "");
    for (int id : ids) std::printf(" %d", id);
    std::printf("]");
  }
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "[finish: %s, prompt tokens: %d, completion tokens: %d]\n",
               FinishName(last.finish_reason()), last.usage().prompt_tokens(),
               last.usage().completion_tokens());
  if (!status.ok()) return Fail(fmt::format("{}: {}", server, status.error_message()));
  return 0;
}
