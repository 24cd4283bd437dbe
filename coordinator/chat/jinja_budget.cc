#include "coordinator/chat/jinja_budget.h"

#include "absl/strings/str_cat.h"

namespace ringserve::chat::jinja {
namespace {

thread_local RenderBudget* current_budget = nullptr;

}  // namespace

RenderBudget::Scope::Scope(RenderBudget* budget) : saved_(current_budget) {
  current_budget = budget;
}

RenderBudget::Scope::~Scope() { current_budget = saved_; }

RenderBudget* RenderBudget::Current() { return current_budget; }

bool RenderBudget::ChargeSteps(int64_t steps) {
  if (!status_.ok()) return false;
  steps_ += steps;
  if (steps_ <= limits_.max_steps) return true;
  return Fail(absl::InvalidArgumentError(absl::StrCat(
      "render exceeds ", limits_.max_steps, " steps (loops, recursion or values too large)")));
}

bool RenderBudget::ChargeBytes(size_t bytes) {
  if (!status_.ok()) return false;
  // Saturates instead of overflowing: one charge may be any size_t.
  const int64_t room = limits_.max_bytes - bytes_;
  if (bytes <= static_cast<size_t>(room > 0 ? room : 0)) {
    bytes_ += static_cast<int64_t>(bytes);
    return true;
  }
  bytes_ = limits_.max_bytes + 1;
  const bool mib = limits_.max_bytes % (1 << 20) == 0;
  return Fail(absl::InvalidArgumentError(
      absl::StrCat("render builds more than ", mib ? limits_.max_bytes >> 20 : limits_.max_bytes,
                   mib ? " MiB" : " bytes", " of values (strings or lists too large)")));
}

bool RenderBudget::Fail(absl::Status error) {
  if (status_.ok()) status_ = std::move(error);
  return false;
}

bool ChargeSteps(int64_t steps) {
  RenderBudget* b = RenderBudget::Current();
  return b == nullptr || b->ChargeSteps(steps);
}

bool ChargeBytes(size_t bytes) {
  RenderBudget* b = RenderBudget::Current();
  return b == nullptr || b->ChargeBytes(bytes);
}

bool ChargeScan(size_t bytes) {
  if (bytes < kScanBytesPerStep) return RenderOk();
  return ChargeSteps(static_cast<int64_t>(bytes / kScanBytesPerStep));
}

bool ChargeSearch(size_t haystack, size_t needle) {
  if (needle < kScanBytesPerStep) return ChargeScan(haystack);
  const int64_t rows = static_cast<int64_t>(haystack / kScanBytesPerStep + 1);
  const int64_t columns = static_cast<int64_t>(needle / kScanBytesPerStep + 1);
  return ChargeSteps(rows * columns);  // at most (2^26 / 2^8 + 1)^2: no overflow
}

bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  ChargeScan(a.size());
  return a == b;
}

bool FailRender(absl::Status error) {
  RenderBudget* b = RenderBudget::Current();
  if (b != nullptr) b->Fail(std::move(error));
  return false;
}

bool RenderOk() {
  RenderBudget* b = RenderBudget::Current();
  return b == nullptr || b->ok();
}

absl::Status RenderError() {
  RenderBudget* b = RenderBudget::Current();
  if (b != nullptr && !b->ok()) return b->status();
  return absl::InvalidArgumentError("render budget spent");
}

}  // namespace ringserve::chat::jinja
