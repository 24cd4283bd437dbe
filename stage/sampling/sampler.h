// Token sampling on the last stage, from fp32 logits on the host.
//
// Determinism: the token drawn for a row depends only on that row's logits, its parameters and
// (seed, token_index) — never on the row's position in the batch, on the other rows, or on how
// many draws happened before. The random number is a counter-based hash (splitmix64) of
// (seed, token_index): there is no generator state anywhere. `token_index` is the index of the
// token being generated within its request (0 for the first generated token), so a request
// replays the same text with the same seed whatever the partition, batch or preemptions.
//
// Algorithm for a row (temperature > 0), in this order:
//   1. z = logits / temperature;
//   2. top-k (k > 0): keep the k largest z (ties: lower id first);
//   3. probabilities p = softmax(z) over what is kept;
//   4. top-p (< 1): keep the smallest prefix of the candidates sorted by p descending (ties:
//      lower id first) whose cumulative probability reaches top_p (at least one token);
//   5. draw u = U[0, 1) from hash(seed, token_index) and take the inverse CDF over the kept
//      candidates, renormalized, in the order (p descending, id ascending).
// temperature == 0 is greedy: argmax, ties -> lowest id (top-k/top-p/seed are then ignored).
// NaN logits are treated as -infinity; a row that is all -inf/NaN yields token 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ring/sampling_config.h"

namespace ringserve {

// The uniform draw in [0, 1) for (seed, token_index); exposed for tests.
double SamplingUniform(uint64_t seed, uint64_t token_index);

// Argmax of a row; ties -> lowest id; NaN counts as -inf. Returns 0 for an empty row.
int32_t GreedyToken(std::span<const float> logits);

// Samples one token from one row of `vocab_size` logits. The config must be valid
// (ValidateSamplingConfig); invalid values are a programmer error here.
int32_t SampleRow(std::span<const float> logits, const RowSampling& row);

// log softmax(logits)[token] of the raw logits (no temperature, top-k or top-p): the logprob
// reported with a sampled token. NaN counts as -inf; -inf for a token out of range.
float TokenLogprob(std::span<const float> logits, int32_t token);

// Samples every row of `logits` ([rows.size(), vocab_size] fp32, host, row-major): one token
// per row, in row order; a row's suppress_token_ids are never drawn (their logits count as -inf;
// a row with every token suppressed yields 0). InvalidArgument if logits.size() != rows.size() *
// vocab_size, vocab_size < 1, or a row's config is invalid (the message names the row). Thread-safe
// (pure function).
absl::StatusOr<std::vector<int32_t>> SampleTokens(std::span<const float> logits, int vocab_size,
                                                  std::span<const RowSampling> rows);

}  // namespace ringserve
