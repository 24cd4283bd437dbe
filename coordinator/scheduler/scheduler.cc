#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "common/logging.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

// Priority key: (arrival order, id). Lower arrival = older = higher priority.
using Key = std::pair<uint64_t, uint64_t>;

}  // namespace

struct Scheduler::State {
  struct Sequence {
    uint64_t id = 0;
    uint64_t arrival = 0;         // unique per AddRequest: also tells incarnations of an id apart
    std::vector<int32_t> tokens;  // prompt, then generated
    int prompt_len = 0;
    int max_tokens = 0;  // after the clamp
    SequenceParams params;
    bool running = false;
    // Positions whose chunk has been planned. Their K/V is written when those plans run.
    int num_scheduled = 0;
    int in_flight = 0;            // plans in flight that name this sequence
    bool awaiting_token = false;  // its sampling chunk is in flight
    // Plan-ahead: a second sampling chunk is in flight, a decode of the token awaited.
    bool ahead = false;
    std::vector<int32_t> blocks;
    // Prefix caching: its first `num_hashed` blocks are registered (or were found) in the
    // cache, and `chain` is the last one's hash.
    int num_hashed = 0;
    uint64_t chain = kPrefixRoot;
    // Speculative decoding (speculation.h): drafts the last stage proposed after the last
    // token, the drafts of the verification chunk in flight, the tokens told to the last stage
    // in this incarnation (ChunkSpeculationWire context), and the adaptive k.
    std::vector<int32_t> drafts;
    int verifying = 0;
    int draft_told = 0;
    SpeculationPolicy speculation;

    int num_generated() const { return static_cast<int>(tokens.size()) - prompt_len; }
    int pending() const { return static_cast<int>(tokens.size()) - num_scheduled; }
    Key key() const { return {arrival, id}; }
    // Feeds its last sampled token next (or a one-token prompt tail, which is the same thing).
    bool decode_ready() const {
      return running && !awaiting_token && num_scheduled > 0 && pending() == 1;
    }
    bool decoding() const { return running && (awaiting_token || decode_ready()); }
  };

  struct PlanRecord {
    std::vector<PlannedChunk> entries;
    std::vector<uint64_t> arrivals;  // per entry: the incarnation it was planned for
    uint64_t follows = 0;            // plan-ahead: the plan it follows (0: a new chain)
    bool followed = false;           // plan-ahead: a follow-up of it has been planned
    // Speculation's payoff (speculation_payoff.h): decode-only plans are timed.
    bool measured = false;
    SpeculationPayoff::Mode mode = SpeculationPayoff::Mode::kSpeculate;
    bool warm = false;  // the plan before it was planned in the same mode
    int decoding = 0;
    double issued_s = 0;
  };

  explicit State(const SchedulerOptions& options)
      : blocks(options.kv_num_blocks, options.kv_block_size) {}

  KvBlockManager blocks;
  std::map<uint64_t, Sequence> sequences;
  std::set<Key> waiting;
  std::set<Key> running;
  std::map<uint64_t, PlanRecord> plans;
  uint64_t next_arrival = 1;
  uint64_t next_plan_id = 1;
  uint64_t last_done = 0;  // the newest plan whose tokens came back
  SchedulerStats counters;
  std::vector<uint64_t> released;  // speculation state to drop, sent with the next plan
  SpeculationPayoff payoff;
  SpeculationPayoff::Mode last_mode = SpeculationPayoff::Mode::kPlain;  // of the last plan
  double last_done_s = 0;  // when the last plan came back (payoff timing)

  // Forgets what the last stage was told about `seq` (its draft state goes too).
  void ResetSpeculation(Sequence& seq) {
    if (seq.draft_told > 0) released.push_back(seq.id);
    seq.drafts.clear();
    seq.verifying = 0;
    seq.draft_told = 0;
  }

  Sequence* Find(uint64_t id, uint64_t arrival) {
    auto it = sequences.find(id);
    if (it == sequences.end() || it->second.arrival != arrival) return nullptr;
    return &it->second;
  }

  void Remove(uint64_t id) {
    auto it = sequences.find(id);
    if (it == sequences.end()) return;
    Sequence& seq = it->second;
    ResetSpeculation(seq);
    blocks.Free(seq.blocks);
    (seq.running ? running : waiting).erase(seq.key());
    sequences.erase(it);
  }

  void Preempt(Sequence& seq) {
    RS_LOG_DEBUG("scheduler: preempting sequence {} ({} tokens, {} blocks)", seq.id,
                 seq.tokens.size(), seq.blocks.size());
    blocks.Free(seq.blocks);
    seq.blocks.clear();
    seq.num_scheduled = 0;
    seq.num_hashed = 0;
    seq.chain = kPrefixRoot;
    ResetSpeculation(seq);
    seq.running = false;
    running.erase(seq.key());
    waiting.insert(seq.key());
    ++counters.preemptions;
  }

  // Prefix caching, on admission: takes the cached blocks that hold `seq`'s leading full
  // blocks (at least its last token is left to compute, for its logits) and counts the hit.
  void MatchPrefix(Sequence& seq) {
    const int block_size = blocks.block_size();
    const int max_blocks = static_cast<int>((seq.tokens.size() - 1) / block_size);
    counters.prefix_lookup_tokens += static_cast<int64_t>(seq.tokens.size());
    // Prompt log-probabilities need the logits of every prompt position: nothing is skipped.
    if (seq.params.prompt_logprobs) return;
    while (seq.num_hashed < max_blocks) {
      std::span<const int32_t> tokens(seq.tokens.data() + seq.num_hashed * block_size, block_size);
      std::optional<int32_t> block = blocks.Lookup(seq.chain, tokens);
      if (!block) break;
      seq.blocks.push_back(*block);
      seq.chain = PrefixHash(seq.chain, tokens);
      ++seq.num_hashed;
    }
    seq.num_scheduled = seq.num_hashed * block_size;
    counters.prefix_hit_tokens += seq.num_scheduled;
  }

  // Gives back what MatchPrefix took (admission did not go through after all).
  void UnmatchPrefix(Sequence& seq) {
    counters.prefix_lookup_tokens -= static_cast<int64_t>(seq.tokens.size());
    counters.prefix_hit_tokens -= seq.num_scheduled;
    blocks.Free(seq.blocks);
    seq.blocks.clear();
    seq.num_scheduled = 0;
    seq.num_hashed = 0;
    seq.chain = kPrefixRoot;
  }

  // Registers `seq`'s blocks that its planned positions now fill completely.
  // Positions planned ahead (token not known yet) wait for their token.
  void RegisterFullBlocks(Sequence& seq) {
    const int block_size = blocks.block_size();
    const int known = std::min(seq.num_scheduled, static_cast<int>(seq.tokens.size()));
    while ((seq.num_hashed + 1) * block_size <= known) {
      std::span<const int32_t> tokens(seq.tokens.data() + seq.num_hashed * block_size, block_size);
      blocks.Register(seq.blocks[seq.num_hashed], seq.chain, tokens);
      seq.chain = PrefixHash(seq.chain, tokens);
      ++seq.num_hashed;
    }
  }

  // The youngest running sequence that no plan names (in flight or being built) and that is
  // not older than `needy` (it may be `needy` itself), if any. Older sequences are never
  // preempted for younger ones, so the oldest always progresses.
  Sequence* PreemptionVictim(const Sequence& needy) {
    for (auto it = running.rbegin(); it != running.rend() && *it >= needy.key(); ++it) {
      Sequence& candidate = sequences.at(it->second);
      if (candidate.in_flight == 0 && !candidate.blocks.empty()) return &candidate;
    }
    return nullptr;
  }
};

absl::Status Scheduler::Validate(const SchedulerOptions& options) {
  auto bad = [](const std::string& field, int value, const std::string& rule) {
    return absl::InvalidArgumentError(
        fmt::format("scheduler option {} = {}: {}", field, value, rule));
  };
  if (options.num_stages < 1) return bad("num_stages", options.num_stages, "must be >= 1");
  if (options.max_micro_batches_in_flight < 0) {
    return bad("max_micro_batches_in_flight", options.max_micro_batches_in_flight,
               "must be >= 0 (0 = num_stages)");
  }
  if (options.max_tokens_per_micro_batch < 1) {
    return bad("max_tokens_per_micro_batch", options.max_tokens_per_micro_batch, "must be >= 1");
  }
  if (options.max_sequences_per_micro_batch < 1) {
    return bad("max_sequences_per_micro_batch", options.max_sequences_per_micro_batch,
               "must be >= 1");
  }
  if (options.max_running_sequences < 1) {
    return bad("max_running_sequences", options.max_running_sequences, "must be >= 1");
  }
  if (options.kv_block_size < 1) return bad("kv_block_size", options.kv_block_size, "must be >= 1");
  if (options.kv_num_blocks < 1) return bad("kv_num_blocks", options.kv_num_blocks, "must be >= 1");
  if (options.max_context < 0) return bad("max_context", options.max_context, "must be >= 0");
  return absl::OkStatus();
}

Scheduler::Scheduler(SchedulerOptions options) : options_(std::move(options)) {
  absl::Status status = Validate(options_);
  if (!status.ok()) {
    fmt::print(stderr, "Scheduler: {}\n", std::string(status.message()));
    std::abort();
  }
  if (options_.decode_packing == DecodePacking::kPacked) options_.plan_ahead = false;
  max_in_flight_ = options_.max_micro_batches_in_flight > 0 ? options_.max_micro_batches_in_flight
                                                            : options_.num_stages;
  state_ = std::make_unique<State>(options_);
}

Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

int MicroBatchPlan::num_sampled() const {
  int count = 0;
  for (const PlannedChunk& entry : entries) count += entry.samples ? 1 : 0;
  return count;
}

int MicroBatchPlan::num_decodes() const {
  int count = 0;
  for (const PlannedChunk& entry : entries) count += entry.is_decode ? 1 : 0;
  return count;
}

absl::Status Scheduler::AddRequest(uint64_t seq_id, std::vector<int32_t> prompt_ids,
                                   SequenceParams params, std::vector<int32_t> generated) {
  State& s = *state_;
  if (s.sequences.count(seq_id)) {
    return absl::InvalidArgumentError(fmt::format("request {}: duplicate id", seq_id));
  }
  if (prompt_ids.empty()) {
    return absl::InvalidArgumentError(fmt::format("request {}: empty prompt", seq_id));
  }
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: max_tokens must be >= 1, got {}", seq_id, params.max_tokens));
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt_ids.size());
  // Positions that get K/V: all but the last generated token.
  const int64_t kv_capacity = static_cast<int64_t>(options_.kv_num_blocks) * options_.kv_block_size;
  if (prompt_len > kv_capacity) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: prompt of {} tokens does not fit the KV cache ({} positions)",
                    seq_id, prompt_len, kv_capacity));
  }
  if (options_.max_context > 0 && prompt_len >= options_.max_context) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: prompt of {} tokens leaves no room in the context of {}", seq_id,
                    prompt_len, options_.max_context));
  }
  int64_t max_tokens = std::min<int64_t>(params.max_tokens, kv_capacity - prompt_len + 1);
  if (options_.max_context > 0) {
    max_tokens = std::min<int64_t>(max_tokens, options_.max_context - prompt_len);
  }

  if (static_cast<int64_t>(generated.size()) >= max_tokens) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: {} tokens already generated reach max_tokens {}", seq_id,
                    generated.size(), max_tokens));
  }

  State::Sequence seq;
  seq.id = seq_id;
  seq.arrival = s.next_arrival++;
  seq.tokens = std::move(prompt_ids);
  seq.tokens.insert(seq.tokens.end(), generated.begin(), generated.end());
  seq.prompt_len = static_cast<int>(prompt_len);
  seq.max_tokens = static_cast<int>(max_tokens);
  seq.params = std::move(params);
  s.waiting.insert(seq.key());
  s.sequences.emplace(seq_id, std::move(seq));
  return absl::OkStatus();
}

bool Scheduler::Cancel(uint64_t seq_id) {
  if (!state_->sequences.count(seq_id)) return false;
  state_->Remove(seq_id);
  return true;
}

bool Scheduler::Finish(uint64_t seq_id) { return Cancel(seq_id); }

std::optional<MicroBatchPlan> Scheduler::NextMicroBatch() {
  State& s = *state_;
  if (!options_.plan_ahead || options_.decode_packing == DecodePacking::kPacked) {
    if (static_cast<int>(s.plans.size()) >= max_in_flight_) return std::nullopt;
    return BuildMicroBatch(0, max_in_flight_ - static_cast<int64_t>(s.plans.size()));
  }
  // Plan-ahead: a chain is a plan whose base is back (or that has none) and its follow-up.
  // New chains first (the follow-up of a plan runs best after the other chains' plans), then
  // the follow-up of the oldest plan without one, once that plan's own base is back. Follow-ups
  // go out in the order of their bases, which is the order the ring finishes them: stage 0 runs
  // plans in order, so a follow-up whose base finishes later would hold up the ones behind it.
  int64_t chains = 0;
  int64_t unfollowed = 0;
  for (const auto& [id, record] : s.plans) {
    if (record.follows != 0 && s.plans.count(record.follows)) continue;
    ++chains;
    if (!record.followed) ++unfollowed;
  }
  const int64_t open_slots = std::max<int64_t>(1, max_in_flight_ - chains + unfollowed);
  if (chains < max_in_flight_) {
    if (std::optional<MicroBatchPlan> plan = BuildMicroBatch(0, open_slots)) return plan;
  }
  for (auto& [id, record] : s.plans) {
    if (record.followed) continue;
    if (record.follows != 0 && s.plans.count(record.follows)) return std::nullopt;  // not yet
    if (std::optional<MicroBatchPlan> plan = BuildMicroBatch(id, open_slots)) return plan;
    // Nothing follows it (its sequences end, or wait for their token): the next chains go on.
    record.followed = true;
  }
  return std::nullopt;
}

std::optional<MicroBatchPlan> Scheduler::BuildMicroBatch(uint64_t follows, int64_t open_slots) {
  State& s = *state_;
  const int block_size = options_.kv_block_size;

  MicroBatchPlan plan;
  State::PlanRecord record;
  std::set<uint64_t> preempted_now;  // not re-admitted in the same plan: that would only thrash
  int64_t budget = options_.max_tokens_per_micro_batch;
  auto room = [&] {
    return budget > 0 &&
           static_cast<int>(plan.batch.chunks.size()) < options_.max_sequences_per_micro_batch;
  };

  // Speculative decoding (speculation.h): only while it pays (speculation_payoff.h).
  int decoding = 0;                      // sequences decoding (runnable or in flight)
  bool prefills = !s.waiting.empty() &&  // a sequence to admit or a prompt to go on with
                  static_cast<int>(s.running.size()) < options_.max_running_sequences;
  for (const Key& key : s.running) {
    const State::Sequence& seq = s.sequences.at(key.second);
    decoding += seq.decoding() ? 1 : 0;
    prefills |= !seq.decoding() && seq.pending() > 0;
  }
  SpeculationPayoff::Mode mode = s.payoff.ModeFor(options_.speculation.payoff, decoding);
  // A plan that prefills does not switch into speculation: the sequences it prefills join the
  // decoding count a plan or two later, and a larger count only lowers speculation's payoff, so
  // the switch would buy a plan or two of drafting for two switches. (In a closed loop the plans
  // that admit successors come at a count below the steady one, in a bucket that such plans,
  // never measured, kept probing speculation.)
  if (options_.speculation.payoff.enabled && prefills &&
      s.last_mode == SpeculationPayoff::Mode::kPlain) {
    mode = SpeculationPayoff::Mode::kPlain;
  }
  const bool speculating =
      options_.speculation.max_drafts > 0 && mode == SpeculationPayoff::Mode::kSpeculate;
  auto speculates = [&](const State::Sequence& seq) {
    return speculating && !seq.params.prompt_logprobs;
  };
  // Drafts to ask for after the sequence's next token: the policy's k, within max_tokens.
  auto drafts_for = [&](const State::Sequence& seq) {
    const int left = seq.max_tokens - seq.num_generated() - 1;
    return std::max(0, std::min(seq.speculation.NextDrafts(options_.speculation, decoding), left));
  };
  // No follow-up while a sequence speculates, in the plan to follow or ready: a follow-up
  // cannot continue a speculating sequence (how many tokens it emits is not known yet), so it
  // would split the decoding sequences into micro-batches that then alternate for good (one
  // that took the sequences ready at the time: on a 1-stage ring, two verification steps of
  // half the batch each, where one step verifies the whole batch at about the cost of either;
  // one of the plain ones only: the speculating ones wait while it follows itself). The next
  // new chain, once the plan is back, takes every decoding sequence.
  if (follows != 0) {
    for (const PlannedChunk& entry : s.plans.at(follows).entries) {
      if (!entry.speculation.draft_ids.empty() || entry.speculation.propose > 0) {
        return std::nullopt;
      }
    }
    for (const Key& key : s.running) {
      const State::Sequence& seq = s.sequences.at(key.second);
      if (seq.decode_ready() && speculates(seq) && (!seq.drafts.empty() || drafts_for(seq) > 0)) {
        return std::nullopt;
      }
    }
  }
  // The verified tokens up to position `end` the last stage has not been told yet.
  auto tell_context = [&](State::Sequence& seq, int64_t end) {
    ChunkSpeculationWire wire;
    wire.active = true;
    wire.context_start = seq.draft_told;
    const int64_t until = std::min<int64_t>(end, static_cast<int64_t>(seq.tokens.size()));
    if (until > seq.draft_told) {
      wire.context_ids.assign(seq.tokens.begin() + seq.draft_told, seq.tokens.begin() + until);
      seq.draft_told = static_cast<int>(until);
    }
    return wire;
  };
  // A verification chunk: [last token, drafts...], every row's logits; positions of rejected
  // drafts come back in OnMicroBatchDone. Not registered in the prefix cache until verified.
  auto add_verification = [&](State::Sequence& seq, int num_drafts) {
    SequenceChunk chunk;
    chunk.seq_id = seq.id;
    chunk.start_position = seq.num_scheduled;
    chunk.num_tokens = 1 + num_drafts;
    chunk.block_table = seq.blocks;
    chunk.logits = LogitsMode::kAllTokens;
    plan.batch.token_ids.push_back(seq.tokens.back());
    plan.batch.token_ids.insert(plan.batch.token_ids.end(), seq.drafts.begin(),
                                seq.drafts.begin() + num_drafts);
    plan.batch.chunks.push_back(std::move(chunk));
    PlannedChunk entry{
        .seq_id = seq.id, .is_decode = true, .samples = true, .token_index = seq.num_generated()};
    entry.speculation = tell_context(seq, seq.num_scheduled + 1);
    entry.speculation.draft_ids.assign(seq.drafts.begin(), seq.drafts.begin() + num_drafts);
    entry.speculation.propose = drafts_for(seq);
    plan.entries.push_back(entry);
    record.entries.push_back(entry);
    record.arrivals.push_back(seq.arrival);
    seq.num_scheduled += 1 + num_drafts;
    seq.verifying = num_drafts;
    seq.drafts.clear();
    seq.awaiting_token = true;
    ++seq.in_flight;
    budget -= 1 + num_drafts;
  };

  // Grows `seq`'s block table towards `want` positions and returns how many positions it may
  // use now (> seq.num_scheduled), or -1 when it cannot progress. When not a single position is
  // free, preempts the youngest idle running sequence while `may_preempt`; that may be `seq`.
  auto reserve = [&](State::Sequence& seq, int64_t want, bool may_preempt) -> int64_t {
    while (true) {
      int64_t have = static_cast<int64_t>(seq.blocks.size()) * block_size;
      int64_t reachable = have + static_cast<int64_t>(s.blocks.num_free()) * block_size;
      if (reachable > seq.num_scheduled) {
        int64_t positions = std::min(want, reachable);
        int extra = s.blocks.BlocksFor(positions) - static_cast<int>(seq.blocks.size());
        if (extra > 0) {
          std::vector<int32_t> got = *s.blocks.Allocate(extra);
          seq.blocks.insert(seq.blocks.end(), got.begin(), got.end());
        }
        return positions;
      }
      if (!may_preempt) return -1;
      State::Sequence* victim = s.PreemptionVictim(seq);
      if (victim == nullptr) return -1;
      s.Preempt(*victim);
      plan.preempted.push_back(victim->id);
      preempted_now.insert(victim->id);
      if (victim == &seq) return -1;
    }
  };

  auto add_chunk = [&](State::Sequence& seq, int64_t num_tokens, bool is_decode) {
    SequenceChunk chunk;
    chunk.seq_id = seq.id;
    chunk.start_position = seq.num_scheduled;
    chunk.num_tokens = static_cast<int32_t>(num_tokens);
    chunk.block_table = seq.blocks;
    const bool samples = seq.num_scheduled + num_tokens == static_cast<int64_t>(seq.tokens.size());
    chunk.logits = samples ? LogitsMode::kLastToken : LogitsMode::kNone;
    std::vector<int32_t> score_ids;
    if (seq.params.prompt_logprobs && !is_decode && seq.num_scheduled < seq.prompt_len) {
      chunk.logits = LogitsMode::kAllTokens;
      const int64_t end = std::min<int64_t>(seq.num_scheduled + num_tokens + 1,
                                            static_cast<int64_t>(seq.tokens.size()));
      score_ids.assign(seq.tokens.begin() + seq.num_scheduled + 1, seq.tokens.begin() + end);
    }
    plan.batch.token_ids.insert(plan.batch.token_ids.end(), seq.tokens.begin() + seq.num_scheduled,
                                seq.tokens.begin() + seq.num_scheduled + num_tokens);
    plan.batch.chunks.push_back(std::move(chunk));
    PlannedChunk entry{.seq_id = seq.id,
                       .is_decode = is_decode,
                       .samples = samples,
                       .token_index = samples ? seq.num_generated() : 0,
                       .score_token_ids = std::move(score_ids)};
    // The last stage hears of a sequence only when it is to draft (then all the context it
    // lacks): other chunks take its plain sampling path.
    if (speculates(seq) && samples) {
      if (const int propose = drafts_for(seq); propose > 0) {
        entry.speculation = tell_context(seq, seq.num_scheduled + num_tokens);
        entry.speculation.propose = propose;
      }
    }
    plan.entries.push_back(entry);
    record.entries.push_back(entry);
    record.arrivals.push_back(seq.arrival);
    seq.num_scheduled += static_cast<int>(num_tokens);
    if (options_.prefix_caching) s.RegisterFullBlocks(seq);
    seq.awaiting_token = samples;
    ++seq.in_flight;
    budget -= num_tokens;
  };

  // A decode of the token that plan `follows` samples for `seq`, not known yet (plan-ahead).
  auto add_ahead = [&](State::Sequence& seq) {
    SequenceChunk chunk;
    chunk.seq_id = seq.id;
    chunk.start_position = seq.num_scheduled;
    chunk.num_tokens = 1;
    chunk.block_table = seq.blocks;
    chunk.logits = LogitsMode::kLastToken;
    plan.batch.token_ids.push_back(0);  // stage 0 puts the sampled token here
    plan.batch.chunks.push_back(std::move(chunk));
    PlannedChunk entry{.seq_id = seq.id,
                       .is_decode = true,
                       .samples = true,
                       .token_index = seq.num_generated() + 1,
                       .ahead = true};
    plan.entries.push_back(entry);
    record.entries.push_back(entry);
    record.arrivals.push_back(seq.arrival);
    seq.num_scheduled += 1;
    seq.ahead = true;
    ++seq.in_flight;
    budget -= 1;
    ++s.counters.ahead_decodes;
  };

  // 1. Decodes, oldest first; in spread mode about D / M of them.
  std::vector<uint64_t> ready;
  for (const Key& key : s.running) {
    const State::Sequence& seq = s.sequences.at(key.second);
    if (seq.decode_ready()) ready.push_back(seq.id);
  }
  int64_t decode_quota = static_cast<int64_t>(ready.size());
  int64_t ahead_quota = static_cast<int64_t>(options_.max_sequences_per_micro_batch);
  if (options_.decode_packing == DecodePacking::kPacked && decoding > decode_quota) {
    decode_quota = 0;  // one decode step at a time: wait until every decoding sequence is back
  }
  if (options_.decode_packing == DecodePacking::kSpread) {
    // ceil(D / M) per micro-batch, and the ready ones shared evenly over the free slots, so
    // that 9 decodes over 4 slots go 3, 2, 2, 2 (not 3, 3, 3 and an idle stage).
    const int64_t free_slots = open_slots;
    const int64_t per_slot = (decode_quota + free_slots - 1) / free_slots;
    const int64_t per_batch = (decoding + max_in_flight_ - 1) / max_in_flight_;
    decode_quota = std::min({decode_quota, per_slot, per_batch});
    ahead_quota = per_batch;
  }
  // 0. A follow-up (plan-ahead) first decodes the sampling sequences of the plan it follows,
  // fed with the tokens that plan samples (stage 0 takes them from the token back edge). Not a
  // sequence whose awaited token is its last by max_tokens, nor one that would need a block
  // taken by preemption: those continue by the synchronous path once their token is back.
  int64_t ahead_added = 0;
  if (follows != 0) {
    const State::PlanRecord& base = s.plans.at(follows);
    for (size_t i = 0; i < base.entries.size(); ++i) {
      if (!base.entries[i].samples) continue;
      if (ahead_added == ahead_quota || !room()) break;
      State::Sequence* seq = s.Find(base.entries[i].seq_id, base.arrivals[i]);
      if (seq == nullptr || !seq->running || !seq->awaiting_token || seq->ahead ||
          seq->pending() != 0 || seq->num_generated() + 1 >= seq->max_tokens) {
        continue;
      }
      // Not after a chunk that verifies or drafts (how many tokens it emits is not known), nor
      // for a sequence that is to draft next (it goes by the synchronous path).
      const ChunkSpeculationWire& base_spec = base.entries[i].speculation;
      if (!base_spec.draft_ids.empty() || base_spec.propose > 0 ||
          (speculates(*seq) && drafts_for(*seq) > 0)) {
        continue;
      }
      if (reserve(*seq, seq->num_scheduled + 1, false) < 0) continue;
      add_ahead(*seq);
      ++ahead_added;
    }
    decode_quota = std::max<int64_t>(0, std::min(decode_quota, ahead_quota - ahead_added));
  }
  for (uint64_t id : ready) {
    if (decode_quota == 0 || !room()) break;
    auto it = s.sequences.find(id);
    if (it == s.sequences.end() || !it->second.decode_ready()) continue;  // preempted meanwhile
    State::Sequence& seq = it->second;
    // With drafts: as many as the budget, max_tokens (so positions stay inside the context)
    // and the KV cache allow (reserve may give fewer).
    const int64_t drafts = std::min<int64_t>(
        {speculates(seq) ? static_cast<int64_t>(seq.drafts.size()) : 0,
         std::max<int64_t>(0, budget - 1), std::max(0, seq.max_tokens - seq.num_generated() - 1)});
    const int64_t until = reserve(seq, seq.num_scheduled + 1 + drafts, true);
    if (until < 0) continue;
    if (speculates(seq) && until - seq.num_scheduled > 1) {
      add_verification(seq, static_cast<int>(until - seq.num_scheduled - 1));
    } else {
      seq.drafts.clear();
      if (until > seq.num_scheduled + 1) {  // positions reserved for drafts it will not verify
        const int keep = s.blocks.BlocksFor(seq.num_scheduled + 1);
        s.blocks.Free(std::vector<int32_t>(seq.blocks.begin() + keep, seq.blocks.end()));
        seq.blocks.resize(keep);
      }
      add_chunk(seq, 1, seq.num_generated() > 0);
    }
    --decode_quota;
  }

  // 2. Prefill chunks of running sequences, oldest first.
  std::vector<uint64_t> prefilling;
  for (const Key& key : s.running) {
    const State::Sequence& seq = s.sequences.at(key.second);
    if (!seq.awaiting_token && seq.pending() > 0 && !seq.decode_ready()) {
      prefilling.push_back(seq.id);
    }
  }
  for (uint64_t id : prefilling) {
    if (!room()) break;
    auto it = s.sequences.find(id);
    if (it == s.sequences.end() || !it->second.running) continue;
    State::Sequence& seq = it->second;
    int64_t want = seq.num_scheduled + std::min<int64_t>(seq.pending(), budget);
    int64_t until = reserve(seq, want, true);
    if (until < 0) continue;
    add_chunk(seq, until - seq.num_scheduled, false);
  }

  // 3. Admission, oldest first (preempted requests keep their place); never preempts, and a
  // request that does not fit blocks the younger ones behind it, so nobody starves.
  while (room() && !s.waiting.empty() &&
         static_cast<int>(s.running.size()) < options_.max_running_sequences) {
    State::Sequence& seq = s.sequences.at(s.waiting.begin()->second);
    if (preempted_now.count(seq.id)) break;
    if (options_.prefix_caching) s.MatchPrefix(seq);
    int64_t want = seq.num_scheduled + std::min<int64_t>(seq.pending(), budget);
    int64_t until = reserve(seq, want, false);
    if (until < 0) {
      if (options_.prefix_caching) s.UnmatchPrefix(seq);
      break;
    }
    s.waiting.erase(seq.key());
    s.running.insert(seq.key());
    seq.running = true;
    add_chunk(seq, until - seq.num_scheduled, false);
  }

  if (plan.batch.chunks.empty()) {
    if (!plan.preempted.empty()) {
      RS_LOG_DEBUG("scheduler: preempted {} sequences but planned nothing", plan.preempted.size());
    }
    return std::nullopt;
  }
  plan.released_speculation = std::move(s.released);
  s.released.clear();
  plan.id = s.next_plan_id++;
  if (options_.speculation.max_drafts > 0) {
    // Decode-only plans are measured; in speculation only those that verify or draft: where
    // every sequence's own policy drafts nothing (speculation.h: it backs off at a low
    // acceptance), the plan decodes plainly, and counting it as speculation would credit
    // speculation with plain decoding's rate (a probe of speculation at one stream decided
    // plain decoding from such plans after the sequence's first rejections).
    const bool all_decode = std::all_of(plan.entries.begin(), plan.entries.end(),
                                        [](const PlannedChunk& entry) { return entry.is_decode; });
    const bool drafts =
        std::any_of(plan.entries.begin(), plan.entries.end(), [](const PlannedChunk& entry) {
          return entry.speculation.propose > 0 || !entry.speculation.draft_ids.empty();
        });
    record.measured = all_decode && (mode == SpeculationPayoff::Mode::kPlain || drafts);
    record.mode = mode;
    record.warm = s.last_mode == mode;
    record.decoding = decoding;
    record.issued_s = SpeculationNow();
    s.last_mode = mode;
  }
  if (follows != 0) {
    s.plans.at(follows).followed = true;
    record.follows = follows;
    if (ahead_added > 0) plan.tokens_from = follows;
  }
  if (options_.plan_ahead) {
    plan.back_edge_through = std::max(s.last_done, plan.tokens_from);
    // Later plans take tokens only from plans in flight without a follow-up, or newer ones.
    plan.back_edge_keep_from = plan.id;
    for (const auto& [id, r] : s.plans) {
      if (!r.followed) {
        plan.back_edge_keep_from = id;
        break;
      }
    }
  }
  s.plans.emplace(plan.id, std::move(record));
  ++s.counters.micro_batches_planned;
  return plan;
}

absl::StatusOr<MicroBatchResult> Scheduler::OnMicroBatchDone(
    uint64_t plan_id, std::span<const int32_t> sampled_tokens,
    std::span<const SpeculativeTokens> speculation) {
  State& s = *state_;
  auto plan_it = s.plans.find(plan_id);
  if (plan_it == s.plans.end()) {
    return absl::InvalidArgumentError(fmt::format("micro-batch {}: not in flight", plan_id));
  }
  const State::PlanRecord& record = plan_it->second;
  size_t expected = 0;
  for (const PlannedChunk& entry : record.entries) expected += entry.samples ? 1 : 0;
  if (sampled_tokens.size() != expected) {
    return absl::InvalidArgumentError(fmt::format("micro-batch {}: {} sampled tokens, expected {}",
                                                  plan_id, sampled_tokens.size(), expected));
  }
  if (record.follows != 0 && s.plans.count(record.follows)) {
    return absl::InvalidArgumentError(
        fmt::format("micro-batch {}: its tokens came before those of plan {}, which it follows",
                    plan_id, record.follows));
  }
  if (!speculation.empty() && speculation.size() != sampled_tokens.size()) {
    return absl::InvalidArgumentError(
        fmt::format("micro-batch {}: {} speculation results for {} sampled tokens", plan_id,
                    speculation.size(), sampled_tokens.size()));
  }
  {
    size_t sampled = 0;
    for (const PlannedChunk& entry : record.entries) {
      if (!entry.samples) continue;
      const size_t accepted = speculation.empty() ? 0 : speculation[sampled].accepted.size();
      if (accepted > entry.speculation.draft_ids.size()) {
        return absl::InvalidArgumentError(
            fmt::format("micro-batch {}: seq {} accepted {} of {} drafts", plan_id, entry.seq_id,
                        accepted, entry.speculation.draft_ids.size()));
      }
      ++sampled;
    }
  }
  MicroBatchResult result;
  if (options_.speculation.max_drafts > 0) {
    const double now = SpeculationNow();
    if (record.measured) {
      int emitted = 0;
      size_t sampled = 0;
      for (const PlannedChunk& entry : record.entries) {
        if (!entry.samples) continue;
        emitted +=
            1 + (speculation.empty() ? 0 : static_cast<int>(speculation[sampled].accepted.size()));
        ++sampled;
      }
      // From the later of its issue and the previous completion (the ring's time, also with
      // several micro-batches in flight), plus the time the coordinator took to plan it after
      // that completion: a speculating sequence waits for each result, a plain decode planned
      // ahead hides it, so it is a cost of the mode. The gap is charged up to the micro-batch's
      // own time, so that a ring left idle is not.
      const double ran = now - std::max(record.issued_s, s.last_done_s);
      const double gap = std::clamp(record.issued_s - s.last_done_s, 0.0, ran);
      s.payoff.OnMeasured(options_.speculation.payoff, record.decoding, record.mode, record.warm,
                          ran + gap, emitted);
    }
    s.last_done_s = now;
  }
  size_t next_token = 0;
  std::vector<uint64_t> finished;
  for (size_t i = 0; i < record.entries.size(); ++i) {
    const PlannedChunk& entry = record.entries[i];
    const size_t sampled = next_token;
    const int32_t token = entry.samples ? sampled_tokens[next_token++] : 0;
    State::Sequence* seq = s.Find(entry.seq_id, record.arrivals[i]);
    if (seq == nullptr) {  // cancelled or finished while in flight
      if (entry.ahead) ++s.counters.ahead_discarded;
      continue;
    }
    --seq->in_flight;
    if (!entry.samples) continue;
    // With a decode planned ahead in flight, the sequence now awaits that one's token.
    (seq->ahead ? seq->ahead : seq->awaiting_token) = false;
    // The tokens this chunk emits: accepted drafts, then the sampled token.
    std::vector<int32_t> emitted;
    std::vector<int32_t> drafts;
    if (!speculation.empty()) {
      emitted = speculation[sampled].accepted;
      drafts = speculation[sampled].drafts;
    }
    emitted.push_back(token);
    if (seq->verifying > 0 || !entry.speculation.draft_ids.empty()) {
      // Roll back to the verified length: rejected drafts' positions and blocks go back.
      const int accepted = static_cast<int>(emitted.size()) - 1;
      seq->num_scheduled -= seq->verifying - accepted;
      const int keep = s.blocks.BlocksFor(seq->num_scheduled);
      if (static_cast<int>(seq->blocks.size()) > keep) {
        s.blocks.Free(std::vector<int32_t>(seq->blocks.begin() + keep, seq->blocks.end()));
        seq->blocks.resize(keep);
      }
      seq->speculation.OnVerified(options_.speculation, seq->verifying, accepted);
      ++s.counters.verification_chunks;
      s.counters.drafts_verified += seq->verifying;
      s.counters.drafts_accepted += accepted;
      s.counters.tokens_from_verification += static_cast<int64_t>(emitted.size());
      seq->verifying = 0;
    } else {
      seq->speculation.OnPlainToken();
    }
    FinishReason finish = FinishReason::kNone;
    for (size_t j = 0; j < emitted.size() && finish == FinishReason::kNone; ++j) {
      const int32_t next = emitted[j];
      seq->tokens.push_back(next);
      ++s.counters.tokens_generated;
      const auto& eos = options_.eos_token_ids;
      const auto& stops = seq->params.stop_token_ids;
      if ((!seq->params.ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) ||
          std::find(stops.begin(), stops.end(), next) != stops.end()) {
        finish = FinishReason::kStop;
      } else if (seq->num_generated() >= seq->max_tokens) {
        finish = FinishReason::kLength;
      }
      result.tokens.push_back(TokenUpdate{.seq_id = seq->id,
                                          .token = next,
                                          .token_index = entry.token_index + static_cast<int>(j),
                                          .finish_reason = finish});
    }
    if (finish != FinishReason::kNone) {
      finished.push_back(seq->id);
      continue;
    }
    // Verified positions whose blocks are now full go to the prefix cache.
    if (options_.prefix_caching) s.RegisterFullBlocks(*seq);
    if (entry.speculation.active) seq->drafts = std::move(drafts);
  }
  s.last_done = std::max(s.last_done, plan_id);
  s.plans.erase(plan_it);
  for (uint64_t id : finished) s.Remove(id);
  return result;
}

std::vector<uint64_t> Scheduler::OnMicroBatchFailed(uint64_t plan_id) {
  State& s = *state_;
  std::vector<uint64_t> failed;
  auto plan_it = s.plans.find(plan_id);
  if (plan_it == s.plans.end()) return failed;
  State::PlanRecord record = std::move(plan_it->second);
  s.plans.erase(plan_it);
  for (size_t i = 0; i < record.entries.size(); ++i) {
    State::Sequence* seq = s.Find(record.entries[i].seq_id, record.arrivals[i]);
    if (seq == nullptr) continue;
    failed.push_back(seq->id);
    s.Remove(seq->id);
  }
  return failed;
}

double Scheduler::SpeculationNow() const {
  if (options_.speculation.clock) return options_.speculation.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Scheduler::HasWork() const { return !state_->sequences.empty() || !state_->plans.empty(); }

int Scheduler::num_in_flight() const { return static_cast<int>(state_->plans.size()); }

SchedulerStats Scheduler::Stats() const {
  SchedulerStats stats = state_->counters;
  stats.waiting = static_cast<int>(state_->waiting.size());
  stats.running = static_cast<int>(state_->running.size());
  stats.micro_batches_in_flight = num_in_flight();
  stats.kv_blocks_used = state_->blocks.num_used();
  stats.kv_blocks_cached = state_->blocks.num_cached_idle();
  stats.kv_blocks_total = state_->blocks.num_blocks();
  return stats;
}

std::vector<int32_t> Scheduler::GeneratedTokens(uint64_t seq_id) const {
  auto it = state_->sequences.find(seq_id);
  if (it == state_->sequences.end()) return {};
  const State::Sequence& seq = it->second;
  return std::vector<int32_t>(seq.tokens.begin() + seq.prompt_len, seq.tokens.end());
}

absl::Status Scheduler::CheckInvariants() const {
  const State& s = *state_;
  auto broken = [](const std::string& what) {
    return absl::InternalError("scheduler invariant broken: " + what);
  };
  const int max_plans = max_in_flight_ * (options_.plan_ahead ? 2 : 1);
  if (static_cast<int>(s.plans.size()) > max_plans) {
    return broken(fmt::format("{} plans in flight > {}", s.plans.size(), max_plans));
  }
  // Live incarnations named by in-flight plans.
  std::map<uint64_t, int> in_flight;
  std::map<uint64_t, int> sampling;
  for (const auto& [plan_id, record] : s.plans) {
    for (size_t i = 0; i < record.entries.size(); ++i) {
      auto it = s.sequences.find(record.entries[i].seq_id);
      if (it == s.sequences.end() || it->second.arrival != record.arrivals[i]) continue;
      ++in_flight[it->first];
      if (record.entries[i].samples) ++sampling[it->first];
    }
  }
  std::vector<int> owner(s.blocks.num_blocks(), 0);
  int owned = 0;
  for (const auto& [id, seq] : s.sequences) {
    const std::string name = fmt::format("sequence {}", id);
    if (seq.running != (s.running.count(seq.key()) == 1) ||
        seq.running == (s.waiting.count(seq.key()) == 1)) {
      return broken(name + " is not in exactly one of the running/waiting sets");
    }
    if (seq.in_flight != in_flight[id]) {
      return broken(fmt::format("{} counts {} plans in flight, plans name it {} times", name,
                                seq.in_flight, in_flight[id]));
    }
    if (sampling[id] != (seq.awaiting_token ? 1 : 0) + (seq.ahead ? 1 : 0) ||
        (seq.ahead && !seq.awaiting_token)) {
      return broken(name + " awaiting_token does not match the in-flight sampling chunks");
    }
    if (!seq.running && (!seq.blocks.empty() || seq.num_scheduled != 0 || seq.in_flight != 0)) {
      return broken(name + " is waiting but holds blocks, positions or plans");
    }
    if (static_cast<int>(seq.blocks.size()) != s.blocks.BlocksFor(seq.num_scheduled)) {
      return broken(fmt::format("{} holds {} blocks for {} positions", name, seq.blocks.size(),
                                seq.num_scheduled));
    }
    if (seq.num_scheduled >
            static_cast<int>(seq.tokens.size()) + (seq.ahead ? 1 : 0) + seq.verifying ||
        seq.num_generated() > seq.max_tokens) {
      return broken(name + " planned or generated too much");
    }
    for (int32_t block : seq.blocks) {
      if (block < 0 || block >= s.blocks.num_blocks() || !s.blocks.IsAllocated(block)) {
        return broken(fmt::format("{} holds block {} that is not allocated", name, block));
      }
      if (owner[block]++ == 0) ++owned;
    }
  }
  for (int block = 0; block < s.blocks.num_blocks(); ++block) {
    if (owner[block] != s.blocks.holders(block)) {
      return broken(fmt::format("block {} has {} holders but {} sequences hold it", block,
                                s.blocks.holders(block), owner[block]));
    }
  }
  if (owned != s.blocks.num_used()) {
    return broken(
        fmt::format("{} blocks allocated but {} owned (leak)", s.blocks.num_used(), owned));
  }
  return absl::OkStatus();
}

}  // namespace ringserve
