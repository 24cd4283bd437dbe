// generation_config.json: the end-of-sequence ids generation stops on. transformers' generate()
// stops on the generation config's `eos_token_id` (an integer or a list), which for chat models
// often names more ids than config.json does (openai/gpt-oss-20b: config.json 200002
// <|return|>, generation_config.json [200002, 199999, 200012], adding <|endoftext|> and
// <|call|>; Qwen2.5 Instruct adds <|endoftext|> to <|im_end|>). The coordinator and
// generate_cli stop on the ids of both files (LoadEosTokenIds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/model_config.h"

namespace ringserve {

// The `eos_token_id` of generation_config.json text: an integer, a list of integers, or
// null/absent (empty). `source` names the file in errors: InvalidArgument for malformed JSON or
// an id that is not an int32.
absl::StatusOr<std::vector<int32_t>> ParseGenerationEosTokenIds(const std::string& json_text,
                                                                const std::string& source);

// Reads `model_dir`/generation_config.json (bounded, regular files only); empty when the
// directory has none.
absl::StatusOr<std::vector<int32_t>> LoadGenerationEosTokenIds(const std::string& model_dir);

// `first`, then the ids of `second` it lacks, in order.
std::vector<int32_t> MergeEosTokenIds(std::vector<int32_t> first,
                                      const std::vector<int32_t>& second);

// The ids generation of the model in `model_dir` stops on, `config` being its config.json:
// config.eos_token_ids, then generation_config.json's that it lacks. Errors:
// LoadGenerationEosTokenIds's. Empty when neither file names one.
absl::StatusOr<std::vector<int32_t>> LoadEosTokenIds(const std::string& model_dir,
                                                     const ModelConfig& config);

}  // namespace ringserve
