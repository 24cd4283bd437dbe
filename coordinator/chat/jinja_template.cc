#include "coordinator/chat/jinja_template.h"

#include <ctime>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/chat/jinja_builtins.h"
#include "coordinator/chat/jinja_internal.h"

namespace ringserve::chat::jinja {
namespace {

constexpr size_t kMaxOutputBytes = 64 << 20;
constexpr int kMaxMacroDepth = 64;
// Nested statements and expression nodes being evaluated at once, across macro calls: the
// evaluator recurses once a level (the parser bounds one template level by kMaxNestingDepth,
// macro calls multiply it).
constexpr int kMaxRenderNesting = 1024;
constexpr char kRaisedPrefix[] = "raise_exception: ";

const std::set<std::string>& KnownFilters() {
  static const std::set<std::string> k = {
      "default", "d",       "tojson",     "trim",       "length", "count",      "string",
      "safe",    "escape",  "e",          "upper",      "lower",  "capitalize", "title",
      "first",   "last",    "join",       "list",       "items",  "dictsort",   "map",
      "select",  "reject",  "selectattr", "rejectattr", "sort",   "unique",     "min",
      "max",     "reverse", "sum",        "abs",        "int",    "float",      "replace",
      "center",  "indent",  "wordcount",  "attr",       "round"};
  return k;
}

const std::set<std::string>& KnownTests() {
  static const std::set<std::string> k = {
      "defined", "undefined", "none",  "string",      "number",   "integer",  "float",
      "boolean", "true",      "false", "mapping",     "iterable", "sequence", "callable",
      "escaped", "odd",       "even",  "divisibleby", "eq",       "equalto",  "==",
      "ne",      "!=",        "lt",    "lessthan",    "<",        "gt",       "greaterthan",
      ">",       "le",        "<=",    "ge",          ">=",       "in",       "lower",
      "upper",   "sameas"};
  return k;
}

absl::Status SyntaxError(int line, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template syntax error at line ", line, ": ", what));
}

// Jinja rejects unknown filters and tests when compiling, except inside {% if %} and inline
// if-expressions ("soft" frames), where the error is raised only when the filter runs. Loop
// and macro bodies start a new, non-soft frame.
absl::Status CheckNames(const Expr& e, bool soft) {
  if (!soft && e.kind == Expr::Kind::kFilter && !KnownFilters().count(e.name)) {
    return SyntaxError(e.line,
                       absl::StrCat("unsupported construct: no filter named '", e.name, "'"));
  }
  if (!soft && e.kind == Expr::Kind::kTest && !KnownTests().count(e.name)) {
    return SyntaxError(e.line, absl::StrCat("unsupported construct: no test named '", e.name, "'"));
  }
  soft = soft || e.kind == Expr::Kind::kCond;
  for (const auto& a : e.args) {
    if (a) RS_RETURN_IF_ERROR(CheckNames(*a, soft));
  }
  for (const auto& kv : e.kwargs) {
    if (kv.second) RS_RETURN_IF_ERROR(CheckNames(*kv.second, soft));
  }
  return absl::OkStatus();
}

absl::Status CheckNames(const Body& body, bool soft) {
  for (const auto& s : body) {
    if (s->expr) RS_RETURN_IF_ERROR(CheckNames(*s->expr, soft));
    if (s->filter) RS_RETURN_IF_ERROR(CheckNames(*s->filter, false));
    for (const auto& [cond, b] : s->branches) {
      RS_RETURN_IF_ERROR(CheckNames(*cond, true));
      RS_RETURN_IF_ERROR(CheckNames(b, true));
    }
    for (const auto& [name, dflt] : s->params) {
      if (dflt) RS_RETURN_IF_ERROR(CheckNames(*dflt, false));
    }
    const bool inner_soft = s->kind == Stmt::Kind::kIf;
    RS_RETURN_IF_ERROR(CheckNames(s->body, inner_soft));
    RS_RETURN_IF_ERROR(CheckNames(s->else_body, inner_soft));
  }
  return absl::OkStatus();
}

enum class Flow { kNormal, kBreak, kContinue };

using Frame = Value::Dict;

class Renderer {
 public:
  // `budget` is charged by this render's values (installed on the thread by the caller).
  Renderer(const Value::Dict& vars, const std::vector<std::string>& root_undefined,
           std::chrono::system_clock::time_point now, RenderBudget& budget)
      : vars_(vars), now_(now), budget_(budget) {
    frames_.push_back(NewFrame(root_undefined));
  }

  std::string& out() { return out_; }

  absl::Status ExecBody(const Body& body, Flow* flow) {
    for (const auto& s : body) {
      RS_RETURN_IF_ERROR(Exec(*s, flow));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  // Charges one step of the render budget.
  absl::Status Step(int line) {
    if (!budget_.ChargeSteps(1)) return At(line, budget_.status());
    return absl::OkStatus();
  }

  // One level of evaluator recursion (held in a ScopedDepth on nesting_): fails past
  // kMaxRenderNesting, else charges a step.
  absl::Status CheckLevel(const ScopedDepth& level, int line) {
    if (level.depth() <= kMaxRenderNesting) return Step(line);
    return At(line, absl::InvalidArgumentError(absl::StrCat("render nested deeper than ",
                                                            kMaxRenderNesting,
                                                            " levels (macro recursion too deep)")));
  }

  static absl::Status At(int line, absl::Status s) {
    if (s.ok() || absl::StartsWith(s.message(), "chat template")) return s;
    std::string msg(s.message());
    if (absl::StartsWith(msg, kRaisedPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat("chat template raised an exception at line ",
                                                     line, ": ",
                                                     msg.substr(sizeof(kRaisedPrefix) - 1)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("chat template error at line ", line, ": ", msg));
  }

  absl::Status Emit(const std::string& s, int line) {
    if (!budget_.ok()) return At(line, budget_.status());
    out_ += s;
    if (out_.size() > kMaxOutputBytes) {
      return At(line, absl::InvalidArgumentError("rendered prompt exceeds 64 MiB"));
    }
    return absl::OkStatus();
  }

  // A frame whose locals in `undefined` read as undefined until set (see AnalyzeScopes).
  static std::shared_ptr<Frame> NewFrame(const std::vector<std::string>& undefined) {
    auto f = std::make_shared<Frame>();
    for (const auto& name : undefined) {
      f->emplace_back(name, Value::Undefined(absl::StrCat("'", name, "' is undefined")));
    }
    return f;
  }

  absl::Status ExecInFrame(const Body& body, const std::vector<std::string>& undefined,
                           Flow* flow) {
    frames_.push_back(NewFrame(undefined));
    absl::Status st = ExecBody(body, flow);
    frames_.pop_back();
    return st;
  }

  void Assign(const std::string& name, Value v) {
    Frame& f = *frames_.back();
    for (auto& [k, e] : f) {
      if (k == name) {
        e = std::move(v);
        return;
      }
    }
    f.emplace_back(name, std::move(v));
  }

  absl::Status AssignTargets(const Stmt& s, const Value& v) {
    if (!s.tuple_target) {
      Assign(s.targets[0], v);
      return absl::OkStatus();
    }
    auto items = Iterate(v);
    if (!items.ok()) return At(s.line, items.status());
    if (items->size() != s.targets.size()) {
      return At(s.line,
                TypeError(items->size() > s.targets.size()
                              ? absl::StrCat("too many values to unpack (expected ",
                                             s.targets.size(), ")")
                              : absl::StrCat("not enough values to unpack (expected ",
                                             s.targets.size(), ", got ", items->size(), ")")));
    }
    for (size_t i = 0; i < items->size(); ++i) Assign(s.targets[i], (*items)[i]);
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      for (const auto& [k, v] : **it) {
        if (k == name) return v;
      }
    }
    for (const auto& [k, v] : vars_) {
      if (k == name) return v;
    }
    return Global(name);
  }

  Value Global(const std::string& name) {
    if (name == "range") return Value::MakeFunction("range", CallRange);
    if (name == "namespace" || name == "dict") {
      bool ns = name == "namespace";
      return Value::MakeFunction(name, [ns](CallArgs& args) -> absl::StatusOr<Value> {
        Value::Dict d;
        for (const Value& p : args.positional) {
          if (p.kind() != Value::Kind::kDict) {
            return TypeError("namespace()/dict() positional arguments must be mappings");
          }
          for (const auto& kv : p.dict()) d.push_back(kv);
        }
        for (auto& kv : args.keyword) {
          bool replaced = false;
          for (auto& e : d) {
            if (SameKey(e.first, kv.first)) {
              e.second = kv.second;
              replaced = true;
            }
          }
          if (!replaced) d.push_back(kv);
        }
        return ns ? Value::MakeNamespace(std::move(d)) : Value::MakeDict(std::move(d));
      });
    }
    if (name == "raise_exception") {
      return Value::MakeFunction("raise_exception", [](CallArgs& args) -> absl::StatusOr<Value> {
        return absl::InvalidArgumentError(
            absl::StrCat(kRaisedPrefix, ToPyStr(Arg(args, 0, "message", Value()))));
      });
    }
    if (name == "strftime_now") {
      auto now = now_;
      return Value::MakeFunction("strftime_now", [now](CallArgs& args) -> absl::StatusOr<Value> {
        Value fmt = Arg(args, 0, "format", Value());
        if (!fmt.is_string()) return TypeError("strftime_now() expects a format string");
        std::time_t t = std::chrono::system_clock::to_time_t(now);
        std::tm tm{};
        gmtime_r(&t, &tm);
        char buf[512];
        size_t n = std::strftime(buf, sizeof(buf), fmt.str().c_str(), &tm);
        if (n == 0 && !fmt.str().empty()) return TypeError("strftime_now: format too long");
        return Value::String(std::string(buf, n));
      });
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::StatusOr<Value> CallMacro(const Stmt& m, CallArgs& args) {
    if (depth_ >= kMaxMacroDepth) return TypeError("macro recursion too deep");
    RS_RETURN_IF_ERROR(Step(m.line));
    if (args.positional.size() > m.params.size()) {
      return TypeError(absl::StrCat("macro '", m.text, "' takes not more than ", m.params.size(),
                                    " argument(s)"));
    }
    auto frame = NewFrame(m.frame_undefined);
    std::vector<std::shared_ptr<Frame>> saved = {frames_[0], frame};
    std::swap(saved, frames_);
    std::string saved_out;
    std::swap(saved_out, out_);
    ++depth_;
    absl::Status status;
    for (size_t i = 0; i < m.params.size() && status.ok(); ++i) {
      const auto& [pname, dflt] = m.params[i];
      Value v = Value::Undefined(absl::StrCat("'", pname, "' is undefined"));
      bool given = false;
      if (i < args.positional.size()) {
        v = args.positional[i];
        given = true;
      }
      for (const auto& [k, kv] : args.keyword) {
        if (k == pname) {
          v = kv;
          given = true;
        }
      }
      if (!given && dflt) {
        auto d = Eval(*dflt);
        if (!d.ok()) {
          status = d.status();
          break;
        }
        v = *d;
      }
      frame->emplace_back(pname, v);
    }
    for (const auto& [k, kv] : args.keyword) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.first == k;
      if (!known && status.ok()) {
        status =
            TypeError(absl::StrCat("macro '", m.text, "' takes no keyword argument '", k, "'"));
      }
    }
    Flow flow = Flow::kNormal;
    if (status.ok()) status = ExecBody(m.body, &flow);
    --depth_;
    std::swap(saved, frames_);
    std::swap(saved_out, out_);
    if (!status.ok()) return status;
    return Value::String(std::move(saved_out));
  }

  absl::Status Exec(const Stmt& s, Flow* flow) {
    ScopedDepth level(nesting_);
    RS_RETURN_IF_ERROR(CheckLevel(level, s.line));
    switch (s.kind) {
      case Stmt::Kind::kData:
        return Emit(s.text, s.line);
      case Stmt::Kind::kPrint: {
        auto v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        return Emit(ToPyStr(*v), s.line);
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          auto c = Eval(*cond);
          if (!c.ok()) return c.status();
          if (c->Truthy()) return ExecBody(body, flow);
        }
        return ExecBody(s.else_body, flow);
      case Stmt::Kind::kFor:
        return ExecFor(s, flow);
      case Stmt::Kind::kSet: {
        auto v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        return AssignTargets(s, *v);
      }
      case Stmt::Kind::kSetAttr: {
        Value ns = Lookup(s.targets[0]);
        if (ns.kind() != Value::Kind::kNamespace) {
          return At(s.line, TypeError("cannot assign attribute on non-namespace object"));
        }
        auto v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        // Values that hold no namespace cannot reach back to this one: no cycles, and the depth
        // a value had when it was made stays its depth (see jinja_value.h).
        if (v->holds_namespace()) {
          return At(s.line, TypeError("unsupported construct: a namespace attribute cannot hold "
                                      "a namespace (or a loop object)"));
        }
        for (auto& [k, e] : ns.mutable_dict()) {
          if (k == s.targets[1]) {
            e = *std::move(v);
            return absl::OkStatus();
          }
        }
        ns.mutable_dict().emplace_back(s.targets[1], *std::move(v));
        return absl::OkStatus();
      }
      case Stmt::Kind::kSetBlock: {
        std::string saved;
        std::swap(saved, out_);
        Flow inner = Flow::kNormal;
        absl::Status st = ExecInFrame(s.body, s.frame_undefined, &inner);
        std::swap(saved, out_);
        if (!st.ok()) return st;
        Assign(s.targets[0], Value::String(std::move(saved)));
        return absl::OkStatus();
      }
      case Stmt::Kind::kMacro: {
        const Stmt* m = &s;
        Assign(s.text, Value::MakeFunction(
                           s.text, [this, m](CallArgs& args) { return CallMacro(*m, args); }));
        return absl::OkStatus();
      }
      case Stmt::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Stmt::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
      case Stmt::Kind::kScope:
        return ExecInFrame(s.body, s.frame_undefined, flow);
    }
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& s, Flow* outer_flow) {
    auto iter = Eval(*s.expr);
    if (!iter.ok()) return iter.status();
    auto all = Iterate(*iter);
    if (!all.ok()) return At(s.line, all.status());
    std::vector<Value> items;
    if (s.filter) {
      for (const Value& item : *all) {
        RS_RETURN_IF_ERROR(Step(s.line));
        frames_.push_back(std::make_shared<Frame>());
        absl::Status st = AssignTargets(s, item);
        absl::StatusOr<Value> keep = st.ok() ? Eval(*s.filter) : absl::StatusOr<Value>(st);
        frames_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    Value cycle_args;
    for (int64_t i = 0; i < n; ++i) {
      RS_RETURN_IF_ERROR(Step(s.line));
      Value::Dict loop = {{"index0", Value::Integer(i)},
                          {"index", Value::Integer(i + 1)},
                          {"revindex0", Value::Integer(n - i - 1)},
                          {"revindex", Value::Integer(n - i)},
                          {"first", Value::Bool(i == 0)},
                          {"last", Value::Bool(i == n - 1)},
                          {"length", Value::Integer(n)},
                          {"depth", Value::Integer(1)},
                          {"depth0", Value::Integer(0)}};
      if (i > 0) loop.emplace_back("previtem", items[i - 1]);
      if (i < n - 1) loop.emplace_back("nextitem", items[i + 1]);
      loop.emplace_back("cycle",
                        Value::MakeFunction("cycle", [i](CallArgs& args) -> absl::StatusOr<Value> {
                          if (args.positional.empty())
                            return TypeError("no items for cycling given");
                          return args.positional[static_cast<size_t>(i) % args.positional.size()];
                        }));
      frames_.push_back(NewFrame(s.frame_undefined));
      {
        // The loop object is the evaluator's own, made again each iteration (which costs the
        // step): it is not charged as bytes the template built.
        RenderBudget::Scope uncharged(nullptr);
        frames_.back()->emplace_back("loop", Value::MakeNamespace(std::move(loop)));
      }
      absl::Status st = AssignTargets(s, items[i]);
      Flow flow = Flow::kNormal;
      if (st.ok()) st = ExecBody(s.body, &flow);
      frames_.pop_back();
      if (!st.ok()) return st;
      if (flow == Flow::kBreak) break;
    }
    if (n == 0) return ExecInFrame(s.else_body, s.else_frame_undefined, outer_flow);
    return absl::OkStatus();
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      auto v = Eval(*e.args[i]);
      if (!v.ok()) return v.status();
      args.positional.push_back(*std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      auto v = Eval(*x);
      if (!v.ok()) return v.status();
      args.keyword.emplace_back(k, *std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    ScopedDepth level(nesting_);
    RS_RETURN_IF_ERROR(CheckLevel(level, e.line));
    auto r = EvalInner(e);
    // A value made over the budget fails the render here, whatever the operation returned.
    if (!budget_.ok()) return At(e.line, budget_.status());
    if (!r.ok()) return At(e.line, r.status());
    return r;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.literal;
      case K::kName:
        return Lookup(e.name);
      case K::kGetAttr: {
        RS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(obj, e.name);
      }
      case K::kGetItem: {
        RS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        RS_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key);
      }
      case K::kSlice: {
        RS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1]) {
            RS_ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1]));
          } else {
            parts[i] = Value::None();
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case K::kCall: {
        RS_ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0]));
        if (fn.is_undefined()) return UndefinedError(fn);
        if (fn.kind() != Value::Kind::kFunction) {
          return TypeError(absl::StrCat("'", fn.TypeName(), "' object is not callable"));
        }
        RS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return fn.function()(args);
      }
      case K::kFilter: {
        RS_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        RS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, subject, args);
      }
      case K::kTest: {
        RS_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        RS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        RS_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, subject, args));
        return Value::Bool(r != e.negated);
      }
      case K::kNeg: {
        RS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Negate(v);
      }
      case K::kPos: {
        RS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number()) {
          return TypeError(absl::StrCat("bad operand type for unary +: '", v.TypeName(), "'"));
        }
        return v.is_bool() ? Value::Integer(v.int_value()) : v;
      }
      case K::kNot: {
        RS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!v.Truthy());
      }
      case K::kBinary: {
        RS_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        RS_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return BinaryOp(e.name, a, b);
      }
      case K::kAnd:
      case K::kOr: {
        RS_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (a.Truthy() == (e.kind == K::kOr)) return a;
        return Eval(*e.args[1]);
      }
      case K::kCompare: {
        RS_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          RS_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          RS_ASSIGN_OR_RETURN(bool r, Compare(e.ops[i], left, right));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case K::kCond: {
        RS_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined(
            "the inline if-expression evaluated to false and no else "
            "section was defined.");
      }
      case K::kList:
      case K::kTuple: {
        Value::List items;
        for (const auto& a : e.args) {
          RS_ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return e.kind == K::kList ? Value::MakeList(std::move(items))
                                  : Value::MakeTuple(std::move(items));
      }
      case K::kDict: {
        Value::Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          RS_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          RS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return TypeError("unsupported construct: non-string dict key");
          bool replaced = false;
          for (auto& kv : d) {
            if (SameKey(kv.first, k.str())) {
              kv.second = v;
              replaced = true;
            }
          }
          if (!replaced) d.emplace_back(k.str(), std::move(v));
        }
        return Value::MakeDict(std::move(d));
      }
    }
    return TypeError("unknown expression");
  }

  static absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return PyEquals(a, b);
    if (op == "!=") return !PyEquals(a, b);
    if (op == "in") return Contains(b, a);
    if (op == "notin") {
      RS_ASSIGN_OR_RETURN(bool r, Contains(b, a));
      return !r;
    }
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    if (op == "<") return PyLess(a, b);
    if (op == ">") return PyLess(b, a);
    if (op == "<=") {
      RS_ASSIGN_OR_RETURN(bool r, PyLess(b, a));
      return !r;
    }
    RS_ASSIGN_OR_RETURN(bool r, PyLess(a, b));  // >=
    return !r;
  }

  const Value::Dict& vars_;
  std::chrono::system_clock::time_point now_;
  std::vector<std::shared_ptr<Frame>> frames_;
  std::string out_;
  int depth_ = 0;    // macro calls
  int nesting_ = 0;  // see CheckLevel
  // Every statement, expression node, loop iteration and call is a step (and values charge
  // what they cost), so hostile templates fail instead of hanging or exhausting memory.
  RenderBudget& budget_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Template>> Template::Parse(const std::string& source) {
  RS_ASSIGN_OR_RETURN(Body body, ParseTemplate(source));
  RS_RETURN_IF_ERROR(CheckNames(body, false));
  std::vector<std::string> root_undefined = AnalyzeScopes(body);
  return std::shared_ptr<const Template>(
      new Template(source, std::move(body), std::move(root_undefined)));
}

absl::StatusOr<std::string> Template::Render(const Value::Dict& variables,
                                             std::chrono::system_clock::time_point now,
                                             const RenderLimits& limits) const {
  RenderBudget budget(limits);
  RenderBudget::Scope scope(&budget);
  Renderer r(variables, root_undefined_, now, budget);
  Flow flow = Flow::kNormal;
  RS_RETURN_IF_ERROR(r.ExecBody(body_, &flow));
  if (!budget.ok()) return budget.status();
  return std::move(r.out());
}

}  // namespace ringserve::chat::jinja
