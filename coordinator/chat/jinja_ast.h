// Syntax tree and token stream of the chat-template Jinja interpreter. Produced by
// jinja_parser (ParseTemplate), walked by jinja_template (Template::Render). Immutable after
// parsing.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/chat/jinja_value.h"

namespace ringserve::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kGetAttr,  // args[0].name
    kGetItem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..], kwargs); negated
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kNot,      // not args[0]
    kBinary,   // args[0] op args[1]; op in + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops: == != < <= > >= in notin
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    kList,     // [args...]
    kTuple,    // (args...)
    kDict,     // {args[0]: args[1], args[2]: args[3], ...}
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter/test name, or binary operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  // levels of this subtree (1 for a leaf), bounded by kMaxNestingDepth
};

// Deepest nesting the parser accepts: expression trees (parentheses, brackets, unary operators,
// filter/test chains, subscript/attribute/call chains, binary chains) and nested block tags.
// Rendering and destroying the tree recurse once a level, so hostile templates must not nest
// without bound.
inline constexpr int kMaxNestingDepth = 256;

// Counts one level of recursion on `counter` while alive (the parser's and the renderer's
// nesting limits).
class ScopedDepth {
 public:
  explicit ScopedDepth(int& counter) : counter_(counter) { ++counter_; }
  ~ScopedDepth() { --counter_; }
  ScopedDepth(const ScopedDepth&) = delete;
  ScopedDepth& operator=(const ScopedDepth&) = delete;
  int depth() const { return counter_; }

 private:
  int& counter_;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kData,      // text
    kPrint,     // {{ expr }}
    kIf,        // branches (cond, body) ..., else_body
    kFor,       // for targets in expr [if filter] body [else else_body]
    kSet,       // set targets = expr
    kSetAttr,   // set targets[0].targets[1] = expr
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kScope,  // {% generation %} body {% endgeneration %}: renders body as is
  };
  Kind kind = Stmt::Kind::kData;
  int line = 0;
  std::string text;  // data; macro name
  ExprPtr expr;
  std::vector<std::string> targets;
  bool tuple_target = false;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  ExprPtr filter;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
  // Names that Jinja's compiler binds to "missing" (undefined) when the body's frame starts
  // (for/macro/generation bodies; else_frame_undefined for a for-loop's else), set by
  // AnalyzeScopes.
  std::vector<std::string> frame_undefined;
  std::vector<std::string> else_frame_undefined;
};

// One lexical token inside {{ }} or {% %}.
struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // name, operator, or decoded string literal
  Int int_value = 0;
  double float_value = 0;
  int line = 0;
};

// The template split into text and tags, whitespace control already applied
// (transformers' settings: trim_blocks, lstrip_blocks, keep_trailing_newline=False).
struct Chunk {
  enum class Kind { kData, kPrint, kBlock };
  Kind kind = Kind::kData;
  std::string text;           // data
  std::vector<Token> tokens;  // print/block contents, ending with a kEnd token
  int line = 0;
};

// Errors: InvalidArgument naming the line (unterminated tags/strings, bad characters).
absl::StatusOr<std::vector<Chunk>> Lex(const std::string& source);

// Errors: InvalidArgument naming the construct and line ("unsupported tag 'include'", ...).
absl::StatusOr<Body> ParseTemplate(const std::string& source);

// Reproduces Jinja's compile-time symbol analysis (jinja2/idtracking.py): a name whose first
// use in a frame is an unconditional `set` is a frame-local that is undefined until that set
// runs — also for reads in nested loops and macros. Fills Stmt::frame_undefined of nested
// frames and returns the names for the root frame.
std::vector<std::string> AnalyzeScopes(Body& root);

}  // namespace ringserve::chat::jinja
