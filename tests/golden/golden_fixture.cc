#include "tests/golden/golden_fixture.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ringserve::golden {

std::string FixtureDir(const std::string& arch) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return fmt::format("{}/tests/fixtures/models/{}", root != nullptr ? root : ".", arch);
}

absl::StatusOr<GoldenFixture> LoadGoldenFixture(const std::string& dir) {
  std::ifstream json_in(dir + "/golden.json");
  if (!json_in) return absl::NotFoundError(dir + "/golden.json: cannot open");
  std::stringstream text;
  text << json_in.rdbuf();
  GoldenFixture fixture;
  fixture.dir = dir;
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    fixture.architecture = j.at("architecture").get<std::string>();
    fixture.transformers_version = j.at("transformers_version").get<std::string>();
    fixture.torch_version = j.at("torch_version").get<std::string>();
    fixture.vocab_size = j.at("vocab_size").get<int>();
    if (j.contains("rope_inv_freq") && j["rope_inv_freq"].is_array()) {
      fixture.rope_inv_freq = j["rope_inv_freq"].get<std::vector<float>>();
    }
    const std::string bin_path = dir + "/" + j.at("logits_file").get<std::string>();
    std::ifstream bin(bin_path, std::ios::binary);
    if (!bin) return absl::NotFoundError(bin_path + ": cannot open");
    std::stringstream bytes;
    bytes << bin.rdbuf();
    const std::string blob = bytes.str();
    const size_t total = blob.size() / sizeof(float);
    auto read_rows = [&](int64_t offset, int64_t rows) -> absl::StatusOr<std::vector<float>> {
      const int64_t count = rows * fixture.vocab_size;
      if (offset < 0 || offset + count > static_cast<int64_t>(total)) {
        return absl::InvalidArgumentError(fmt::format("{}: rows out of range", bin_path));
      }
      std::vector<float> out(count);
      std::memcpy(out.data(), blob.data() + offset * sizeof(float), count * sizeof(float));
      return out;
    };
    for (const nlohmann::json& p : j.at("prompts")) {
      GoldenPrompt prompt;
      prompt.token_ids = p.at("token_ids").get<std::vector<int32_t>>();
      prompt.greedy_token_ids = p.at("greedy_token_ids").get<std::vector<int32_t>>();
      auto logits =
          read_rows(p.at("logits_offset").get<int64_t>(), p.at("logits_rows").get<int64_t>());
      if (!logits.ok()) return logits.status();
      prompt.logits = *std::move(logits);
      auto greedy = read_rows(p.at("greedy_logits_offset").get<int64_t>(),
                              p.at("greedy_logits_rows").get<int64_t>());
      if (!greedy.ok()) return greedy.status();
      prompt.greedy_logits = *std::move(greedy);
      fixture.prompts.push_back(std::move(prompt));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}/golden.json: {}", dir, e.what()));
  }
  return fixture;
}

Diff Compare(std::span<const float> got, std::span<const float> ref) {
  Diff d;
  if (got.size() != ref.size()) {
    d.max_abs_diff = INFINITY;
    return d;
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const float diff = std::fabs(got[i] - ref[i]);
    d.max_abs_diff = std::isnan(diff) ? INFINITY : std::max(d.max_abs_diff, diff);
    d.max_abs_ref = std::max(d.max_abs_ref, std::fabs(ref[i]));
  }
  return d;
}

int32_t ArgMax(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace ringserve::golden
