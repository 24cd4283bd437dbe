// `ringserve_client`: a command-line client for the gRPC Generate API.
//
//   ringserve_client [--server HOST:PORT] --prompt "Once upon a time" [--max-tokens N]
//       [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop STR]... [--ignore-eos]
//   ringserve_client --prompt-ids 1,2,3 ...      token ids instead of text
//   ringserve_client --info | --stats | --health | --tokenize "text"
//
// Streams the generated text to stdout (token ids, when the model has no tokenizer); the
// finish reason and usage go to stderr. Exit code 0 on success, 1 on an error.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "proto/generate.grpc.pb.h"

namespace {

constexpr char kUsage[] =
    "usage: ringserve_client [--server HOST:PORT] (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "         [--stop STR]... [--stop-token-id ID]... [--ignore-eos] [--no-special-tokens]\n"
    "         [--request-id ID] [--print-ids] [--api-key-file PATH]\n"
    "       ringserve_client [--server HOST:PORT] --info | --stats | --health | --tokenize TEXT\n";

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
  std::string server = "127.0.0.1:50051";
  std::string mode = "generate";
  std::string tokenize_text;
  bool print_ids = false;
  v1::GenerateRequest request;
  request.set_add_special_tokens(true);
  v1::SamplingParams* sampling = request.mutable_sampling();
  std::string api_key;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ringserve_client: %s needs a value\n%s", arg.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](double* out) {
      std::string v = value();
      if (!absl::SimpleAtod(v, out)) {
        std::fprintf(stderr, "ringserve_client: %s: '%s' is not a number\n", arg.c_str(),
                     v.c_str());
        std::exit(2);
      }
    };
    double n = 0;
    if (arg == "--server") {
      server = value();
    } else if (arg == "--prompt") {
      request.set_text(value());
    } else if (arg == "--prompt-ids") {
      v1::TokenIds* ids = request.mutable_token_ids();
      for (absl::string_view part : absl::StrSplit(value(), ',', absl::SkipWhitespace())) {
        int id = 0;
        if (!absl::SimpleAtoi(part, &id)) return Fail("--prompt-ids: not a list of integers");
        ids->add_ids(id);
      }
    } else if (arg == "--max-tokens") {
      number(&n);
      sampling->set_max_tokens(static_cast<int>(n));
    } else if (arg == "--temperature") {
      number(&n);
      sampling->set_temperature(static_cast<float>(n));
    } else if (arg == "--top-k") {
      number(&n);
      sampling->set_top_k(static_cast<int>(n));
    } else if (arg == "--top-p") {
      number(&n);
      sampling->set_top_p(static_cast<float>(n));
    } else if (arg == "--seed") {
      number(&n);
      sampling->set_seed(static_cast<uint64_t>(n));
    } else if (arg == "--stop") {
      sampling->add_stop(value());
    } else if (arg == "--stop-token-id") {
      number(&n);
      sampling->add_stop_token_ids(static_cast<int>(n));
    } else if (arg == "--ignore-eos") {
      sampling->set_ignore_eos(true);
    } else if (arg == "--no-special-tokens") {
      request.set_add_special_tokens(false);
    } else if (arg == "--request-id") {
      request.set_request_id(value());
    } else if (arg == "--api-key-file") {
      std::ifstream in(value());
      std::getline(in, api_key);
      while (!api_key.empty() && std::isspace(static_cast<unsigned char>(api_key.back()))) {
        api_key.pop_back();
      }
      if (api_key.empty()) return Fail("--api-key-file: cannot read a key from the file");
    } else if (arg == "--print-ids") {
      print_ids = true;
    } else if (arg == "--info" || arg == "--stats" || arg == "--health") {
      mode = arg.substr(2);
    } else if (arg == "--tokenize") {
      mode = "tokenize";
      tokenize_text = value();
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "ringserve_client: unknown argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
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
  while (reader->Read(&response)) {
    if (!response.text().empty()) any_text = true;
    std::fputs(response.text().c_str(), stdout);
    std::fflush(stdout);
    for (int id : response.token_ids()) ids.push_back(id);
    last = response;
  }
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
