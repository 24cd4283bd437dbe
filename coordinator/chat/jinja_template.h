// A parsed Jinja template and its evaluator: the subset of Jinja that Hugging Face chat
// templates use, rendered with transformers' environment (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, {% generation %}, globals raise_exception and
// strftime_now, its own tojson filter). See chat_template.h for the user-facing API.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/chat/jinja_ast.h"
#include "coordinator/chat/jinja_budget.h"
#include "coordinator/chat/jinja_value.h"

namespace ringserve::chat::jinja {

class Template {
 public:
  // Errors: InvalidArgument "chat template syntax error at line N: ..." for syntax errors and
  // unsupported constructs ({% include %}, {% call %}, recursive loops, ...).
  static absl::StatusOr<std::shared_ptr<const Template>> Parse(const std::string& source);

  // Renders with the given top-level variables. `now` feeds strftime_now (formatted in UTC).
  // Errors: InvalidArgument "chat template error at line N: ..." (raise_exception messages,
  // type errors, undefined values used, unknown filters/tests/methods, output over 64 MiB,
  // `limits` exceeded: "render exceeds N steps", "render builds more than N MiB of values",
  // "value too large to print", "value nested deeper than 256 levels").
  // Thread-safe: a render only reads the tree. `limits` bound the work and the values built
  // (jinja_budget.h).
  absl::StatusOr<std::string> Render(const Value::Dict& variables,
                                     std::chrono::system_clock::time_point now,
                                     const RenderLimits& limits = {}) const;

  const std::string& source() const { return source_; }

 private:
  Template(std::string source, Body body, std::vector<std::string> root_undefined)
      : source_(std::move(source)),
        body_(std::move(body)),
        root_undefined_(std::move(root_undefined)) {}

  std::string source_;
  Body body_;
  std::vector<std::string> root_undefined_;  // see AnalyzeScopes
};

}  // namespace ringserve::chat::jinja
