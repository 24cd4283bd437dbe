// Helpers shared by the interpreter's .cc files; not part of any public API.
#pragma once

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/chat/jinja_budget.h"
#include "coordinator/chat/jinja_value.h"

namespace ringserve::chat::jinja {

absl::Status TypeError(const std::string& msg);
// The error for using an undefined value (its hint names it).
absl::Status UndefinedError(const Value& v);
// Positional argument `index`, else keyword `name`, else `dflt`.
Value Arg(const CallArgs& args, size_t index, const char* name, Value dflt);
// Rejects more positional arguments than `names` and unknown keywords.
absl::Status CheckArgs(const CallArgs& args, const std::string& fname,
                       std::initializer_list<const char*> names);
absl::StatusOr<std::string> ArgString(const Value& v, const std::string& fname);
std::u32string ToU32(const std::string& s);
std::string FromU32(const std::u32string& s);
// str.strip / lstrip / rstrip; chars None = Unicode whitespace.
std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right);
// mode: 0 lower, 1 upper, 2 title, 3 capitalize.
std::string PyCaseMap(const std::string& s, int mode);

}  // namespace ringserve::chat::jinja
