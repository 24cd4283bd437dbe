// The arithmetic of speculative decoding on the last stage: the distribution a row is sampled
// from, and the verification of drafted tokens against the target model's logits rows.
// Pure functions; thread-safe.
//
// Verification of a chunk [t, d_1 .. d_k] whose 1 + k logits rows p_0 .. p_k came from the
// target (row i predicts the token after d_i, d_0 = t):
//   greedy (temperature 0): accept d_i while argmax(p_{i-1}) == d_i; the first mismatch emits
//     argmax(p_{i-1}) instead; all accepted: the bonus token argmax(p_k). The emitted tokens are
//     exactly plain greedy decoding's.
//   sampled: standard rejection sampling (Leviathan et al. 2023, Chen et al. 2023). With q_i the
//     draft's distribution that d_i was drawn from and p_i the target's (both after temperature,
//     top-k and top-p: SamplingDistribution), accept d_i with probability min(1, p(d_i)/q(d_i));
//     on rejection emit a token drawn from normalize(max(0, p - q)); all accepted: the bonus
//     token drawn from p_k by the plain sampler. Every emitted token is distributed as the
//     target's sampler would draw it.
// Randomness: counter-based like the sampler (stage/sampling/sampler.h): the uniforms depend on
// (seed, token index, purpose) only, so a seeded request replays the same text.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ring/sampling_config.h"

namespace ringserve {

// What the uniforms of one token index are used for (salts the sampler's seed).
enum class SpeculativeDraw : uint64_t {
  kDraft = 0x5eed'd4af'0000'0001ull,     // drawing a draft token from q
  kAccept = 0x5eed'acce'0000'0002ull,    // accepting a draft with min(1, p/q)
  kResidual = 0x5eed'4e51'0000'0003ull,  // drawing from max(0, p - q) after a rejection
};
double SpeculativeUniform(const SamplingConfig& config, uint64_t token_index,
                          SpeculativeDraw purpose);

// The probabilities the sampler (stage/sampling/sampler.h) draws a row's token from, dense over
// the vocabulary: softmax(logits / temperature) over the top-k / top-p candidates, 0 elsewhere.
// temperature 0: one-hot on the greedy token.
std::vector<double> SamplingDistribution(std::span<const float> logits,
                                         const SamplingConfig& config);

// Inverse CDF in id order of `probs` (need not be normalized; all-zero: token 0) at u in [0, 1).
int32_t DrawFromDistribution(std::span<const double> probs, double u);

struct Verification {
  std::vector<int32_t> accepted;  // the accepted prefix of the drafts
  int32_t token = 0;              // then this one: the correction or the bonus token
};

// `target_rows`: [1 + drafts.size(), vocab] fp32 logits. `row`: the chunk's sampling; its
// token_index is the index of the token row 0 predicts (row i: token_index + i).
// `draft_probs`: [drafts.size(), vocab] the draft distributions q_i (ignored when greedy).
Verification VerifyDrafts(std::span<const float> target_rows, int vocab_size,
                          std::span<const int32_t> drafts, std::span<const double> draft_probs,
                          const RowSampling& row);

}  // namespace ringserve
