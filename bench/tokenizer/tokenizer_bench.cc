// Encodes the tokenizer benchmark corpus (bench/tokenizer/make_bench_corpus.py) on one thread,
// one Encode call per document, and prints MB/s and tokens/s.
//
//   tokenizer_bench CORPUS.json TOKENIZER_DIR [TOKENIZER_DIR...]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "coordinator/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::vector<std::string> args;
  ringserve::ParseCommandLineFlags(
      argc, argv,
      "Encodes the tokenizer benchmark corpus and prints MB/s and tokens/s.\n"
      "usage: tokenizer_bench CORPUS.json TOKENIZER_DIR [TOKENIZER_DIR...]",
      &args);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: %s CORPUS.json TOKENIZER_DIR [TOKENIZER_DIR...]\n", argv[0]);
    return 2;
  }
  std::ifstream in(args[0], std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::vector<std::string> docs;
  try {
    docs = nlohmann::json::parse(buffer.str()).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "cannot read corpus %s: %s\n", args[0].c_str(), e.what());
    return 1;
  }
  size_t total_bytes = 0;
  for (const std::string& d : docs) total_bytes += d.size();
  for (size_t t = 1; t < args.size(); ++t) {
    const auto load_start = std::chrono::steady_clock::now();
    auto tokenizer = ringserve::Tokenizer::FromDirectory(args[t]);
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
      return 1;
    }
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    for (size_t i = 0; i < docs.size() && i < 50; ++i) (void)(*tokenizer)->Encode(docs[i], false);
    double best_s = 1e30;
    size_t tokens = 0;
    for (int rep = 0; rep < 2; ++rep) {
      tokens = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const std::string& d : docs) {
        auto ids = (*tokenizer)->Encode(d, /*add_special_tokens=*/false);
        if (!ids.ok()) {
          std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
          return 1;
        }
        tokens += ids->size();
      }
      best_s = std::min(
          best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf(
        "ringserve %s: %.2f MB in %.3f s: %.2f MB/s, %.0f tokens/s (%zu tokens; load %.2f s)\n",
        args[t].c_str(), total_bytes / 1e6, best_s, total_bytes / 1e6 / best_s, tokens / best_s,
        tokens, load_s);
  }
  return 0;
}
