// Operations of the chat-template Jinja interpreter with Python/Jinja semantics: attribute
// and item lookup (including str/dict methods), operators, iteration, and the filters and
// tests that chat templates use. Errors are InvalidArgument with a message that does not
// name a line (the evaluator adds it). Unknown filters/tests/methods are errors that name
// them.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/chat/jinja_value.h"

namespace ringserve::chat::jinja {

// Jinja's sandbox caps range() at this many items.
inline constexpr int64_t kMaxRange = 100000;

// `obj.name`: methods of str/dict first (like Python getattr), then items; undefined if absent.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
// `obj[key]`: items/indexes first, then attributes; undefined if absent.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` on str/list/tuple.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step);
// + - * / // % ** ~
absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b);
absl::StatusOr<Value> Negate(const Value& v);
// `needle in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& needle);
// Python iteration: list/tuple items, dict keys, str characters; undefined is empty.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// len(v); undefined is 0.
absl::StatusOr<int64_t> Length(const Value& v);

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& subject, CallArgs& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& subject, CallArgs& args);

// Globals that do not depend on the render: range, namespace, dict.
absl::StatusOr<Value> CallRange(CallArgs& args);

}  // namespace ringserve::chat::jinja
