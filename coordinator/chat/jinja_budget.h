// What one chat-template render may spend: steps of work and bytes of values built. Templates
// come from a model's tokenizer_config.json and are untrusted; a value can be shared many times
// inside another (`{% set l = [l, l] %}` forty times is a list of 2^40 leaves in 40 nodes), so
// limits on single operations are not enough: every operation charges the budget of the render
// in progress, and the first charge over a limit fails the render.
//
// The budget is charged through the calling thread: Template::Render installs one with a
// RenderBudget::Scope, and the value layer charges RenderBudget::Current() (nothing outside a
// render):
//   - steps: every statement, expression node, loop iteration and call (the evaluator), every
//     node that printing, JSON dumping or comparing visits, and one per kScanBytesPerStep bytes
//     of string that an operation reads;
//   - bytes: every string, list, tuple and dict value made (its characters, its items times
//     sizeof(Value)) and every string decoded to code points (4 bytes a character), whether or
//     not it is kept, so both memory and copying time are bounded.
// Value factories cannot fail, so a charge over a limit records the error (status()); the
// evaluator checks it after every expression and statement, and operations that loop over a
// value stop early once it is set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ringserve::chat::jinja {

// Largest string a render may build (the rendered prompt has the same cap) and longest list
// it may build by concatenation, so that hostile templates fail instead of exhausting memory.
inline constexpr size_t kMaxStringBytes = 64 << 20;
inline constexpr size_t kMaxListItems = 1 << 20;
// Deepest list/dict nesting a render may build (printing, comparing and destroying values
// recurse once a level). Values from the request are bounded by kMaxJsonDepth, below this.
inline constexpr int kMaxValueDepth = 256;
// Bytes of string an operation may read (len, ==, in, find, ...) for one step.
inline constexpr size_t kScanBytesPerStep = 256;

struct RenderLimits {
  int64_t max_steps = 10'000'000;
  int64_t max_bytes = int64_t{512} << 20;
};

// One render's account. Not thread-safe: a render runs on one thread.
class RenderBudget {
 public:
  explicit RenderBudget(const RenderLimits& limits) : limits_(limits) {}
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // Makes `budget` the one charged by this thread's value operations while alive (nests).
  class Scope {
   public:
    explicit Scope(RenderBudget* budget);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RenderBudget* saved_;
  };
  // The budget of the render running on this thread; nullptr outside a render.
  static RenderBudget* Current();

  // Each returns false once the budget has failed (this charge or an earlier one).
  bool ChargeSteps(int64_t steps);
  bool ChargeBytes(size_t bytes);
  // Records `error` unless an error is already recorded; returns false.
  bool Fail(absl::Status error);

  bool ok() const { return status_.ok(); }
  // The first limit exceeded or error recorded, with what the template was doing.
  const absl::Status& status() const { return status_; }
  int64_t steps() const { return steps_; }
  int64_t bytes() const { return bytes_; }

 private:
  const RenderLimits limits_;
  int64_t steps_ = 0;
  int64_t bytes_ = 0;
  absl::Status status_;
};

// Charges the current render's budget, if any; each returns false once the render has failed
// (true outside a render).
bool ChargeSteps(int64_t steps);
bool ChargeBytes(size_t bytes);
// Reading `bytes` of string: one step per kScanBytesPerStep.
bool ChargeScan(size_t bytes);
// Searching `haystack` bytes for a `needle` of that many bytes (find, in, replace, split,
// count): a naive search compares up to both lengths' product, so one step per
// kScanBytesPerStep squared of it (a needle under kScanBytesPerStep costs a scan).
bool ChargeSearch(size_t haystack, size_t needle);
// Whether two dict keys are equal, charging the comparison (keys of equal length compare by
// their bytes).
bool SameKey(const std::string& a, const std::string& b);
// Records `error` on the current render (the render fails with it); returns false.
bool FailRender(absl::Status error);
// False once the current render has failed.
bool RenderOk();
// The current render's error; a generic InvalidArgument when there is none (an operation that
// stopped because a charge failed outside a render cannot happen, but must not return OK).
absl::Status RenderError();

}  // namespace ringserve::chat::jinja
