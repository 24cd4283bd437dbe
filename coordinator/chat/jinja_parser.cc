// Recursive-descent parser following Jinja's own grammar (jinja2/parser.py), including its
// precedences: or < and < not < comparisons < + - < ~ < * / // % < ** < unary -/+ <
// postfix (. [] ()) and filters/tests.
#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_ast.h"

namespace ringserve::chat::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  absl::StatusOr<Body> Parse() {
    Body body;
    std::string end;
    if (!ParseBody(&body, {}, &end)) return error_;
    return body;
  }

 private:
  // ---- token cursor within one tag ----
  const Token& Cur() const { return (*toks_)[ti_]; }
  const Token& Peek(size_t k = 1) const {
    size_t i = ti_ + k < toks_->size() ? ti_ + k : toks_->size() - 1;
    return (*toks_)[i];
  }
  bool IsOp(const char* op) const { return Cur().kind == Token::Kind::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().kind == Token::Kind::kName && Cur().text == n; }
  bool AtEnd() const { return Cur().kind == Token::Kind::kEnd; }
  void Next() {
    if (ti_ + 1 < toks_->size()) ++ti_;
  }
  std::string Describe(const Token& t) const {
    switch (t.kind) {
      case Token::Kind::kEnd:
        return "end of tag";
      case Token::Kind::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }

  std::nullptr_t Fail(const std::string& what, int line = -1) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat("chat template syntax error at line ",
                                                       line >= 0 ? line : Cur().line, ": ", what));
    }
    return nullptr;
  }
  bool Expect(const char* op) {
    if (!IsOp(op)) {
      Fail(absl::StrCat("expected '", op, "', got ", Describe(Cur())));
      return false;
    }
    Next();
    return true;
  }
  bool ExpectEnd() {
    if (!AtEnd()) {
      Fail(absl::StrCat("expected end of tag, got ", Describe(Cur())));
      return false;
    }
    return true;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr Binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = Make(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return Done(std::move(e));
  }
  // Sets e->depth from its children; fails when the tree nests deeper than kMaxNestingDepth.
  ExprPtr Done(ExprPtr e) {
    if (!e) return nullptr;
    int depth = 0;
    for (const auto& a : e->args) {
      if (a) depth = std::max(depth, a->depth);
    }
    for (const auto& kv : e->kwargs) {
      if (kv.second) depth = std::max(depth, kv.second->depth);
    }
    e->depth = depth + 1;
    if (e->depth > kMaxNestingDepth) return TooDeep(e->line);
    return e;
  }
  std::nullptr_t TooDeep(int line) {
    return Fail(absl::StrCat("template nested deeper than ", kMaxNestingDepth,
                             " levels (expressions and blocks)"),
                line);
  }
  // The parser's own recursion (parentheses, `not`, unary operators, nested tags) is bounded
  // before any node is built: each such level holds a ScopedDepth on nesting_.
  bool TooDeepHere(const ScopedDepth& level) {
    if (level.depth() <= kMaxNestingDepth) return false;
    TooDeep(-1);
    return true;
  }

  // ---- expressions ----
  ExprPtr ParseExpression(bool with_condexpr = true) {
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }
  ExprPtr ParseCondExpr() {
    int line = Cur().line;
    ExprPtr expr1 = ParseOr();
    if (!expr1) return nullptr;
    while (IsName("if")) {
      Next();
      ExprPtr cond = ParseOr();
      if (!cond) return nullptr;
      ExprPtr expr3;
      if (IsName("else")) {
        Next();
        ScopedDepth level(nesting_);
        if (TooDeepHere(level)) return nullptr;
        expr3 = ParseCondExpr();
        if (!expr3) return nullptr;
      }
      ExprPtr e = Make(Expr::Kind::kCond, line);
      e->args.push_back(std::move(expr1));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(expr3));
      expr1 = Done(std::move(e));
      if (!expr1) return nullptr;
    }
    return expr1;
  }
  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (left && IsName("or")) {
      int line = Cur().line;
      Next();
      ExprPtr right = ParseAnd();
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kOr, "or", std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (left && IsName("and")) {
      int line = Cur().line;
      Next();
      ExprPtr right = ParseNot();
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kAnd, "and", std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParseNot() {
    if (IsName("not")) {
      int line = Cur().line;
      Next();
      ScopedDepth level(nesting_);
      if (TooDeepHere(level)) return nullptr;
      ExprPtr inner = ParseNot();
      if (!inner) return nullptr;
      ExprPtr e = Make(Expr::Kind::kNot, line);
      e->args.push_back(std::move(inner));
      return Done(std::move(e));
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    int line = Cur().line;
    ExprPtr first = ParseMath1();
    if (!first) return nullptr;
    ExprPtr cmp;
    static const std::set<std::string> kCmp = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      std::string op;
      if (Cur().kind == Token::Kind::kOp && kCmp.count(Cur().text)) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().kind == Token::Kind::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      ExprPtr rhs = ParseMath1();
      if (!rhs) return nullptr;
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(rhs));
    }
    return cmp ? Done(std::move(cmp)) : std::move(first);
  }
  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (left && (IsOp("+") || IsOp("-"))) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      ExprPtr right = ParseConcat();
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (left && IsOp("~")) {
      int line = Cur().line;
      Next();
      ExprPtr right = ParseMath2();
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kBinary, "~", std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (left && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      ExprPtr right = ParsePow();
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (left && IsOp("**")) {
      int line = Cur().line;
      Next();
      ExprPtr right = ParseUnary(true);
      if (!right) return nullptr;
      left = Binary(Expr::Kind::kBinary, "**", std::move(left), std::move(right), line);
    }
    return left;
  }
  ExprPtr ParseUnary(bool with_filter) {
    ScopedDepth level(nesting_);
    if (TooDeepHere(level)) return nullptr;
    int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      bool neg = IsOp("-");
      Next();
      ExprPtr inner = ParseUnary(false);
      if (!inner) return nullptr;
      node = Make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      node->args.push_back(std::move(inner));
      node = Done(std::move(node));
    } else {
      node = ParsePrimary();
    }
    if (!node) return nullptr;
    node = ParsePostfix(std::move(node));
    if (node && with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }
  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    int line = t.line;
    switch (t.kind) {
      case Token::Kind::kName: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        Next();
        return e;
      }
      case Token::Kind::kString: {
        std::string s;
        while (Cur().kind == Token::Kind::kString) {
          s += Cur().text;
          Next();
        }
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case Token::Kind::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Integer(t.int_value);
        Next();
        return e;
      }
      case Token::Kind::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Float(t.float_value);
        Next();
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          Next();
          ExprPtr e = ParseTuple(/*with_condexpr=*/true, /*explicit_parens=*/true);
          if (!e || !Expect(")")) return nullptr;
          return e;
        }
        if (t.text == "[") {
          Next();
          ExprPtr e = Make(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty() && !Expect(",")) return nullptr;
            if (IsOp("]")) break;
            ExprPtr item = ParseExpression();
            if (!item) return nullptr;
            e->args.push_back(std::move(item));
          }
          Next();
          return Done(std::move(e));
        }
        if (t.text == "{") {
          Next();
          ExprPtr e = Make(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty() && !Expect(",")) return nullptr;
            if (IsOp("}")) break;
            ExprPtr key = ParseExpression();
            if (!key || !Expect(":")) return nullptr;
            ExprPtr value = ParseExpression();
            if (!value) return nullptr;
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          Next();
          return Done(std::move(e));
        }
        [[fallthrough]];
      default:
        return Fail(absl::StrCat("unexpected ", Describe(t)));
    }
  }
  // A comma-separated list becomes a tuple; `()` is the empty tuple.
  ExprPtr ParseTuple(bool with_condexpr, bool explicit_parens,
                     const std::set<std::string>& end_names = {}) {
    int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        is_tuple = true;
      }
      if (AtEnd() || IsOp(")") || IsOp("]") || IsOp("}") ||
          (Cur().kind == Token::Kind::kName && end_names.count(Cur().text))) {
        break;
      }
      ExprPtr e = ParseExpression(with_condexpr);
      if (!e) return nullptr;
      items.push_back(std::move(e));
    }
    if (!is_tuple && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) {
      return Fail(absl::StrCat("expected an expression, got ", Describe(Cur())));
    }
    ExprPtr t = Make(Expr::Kind::kTuple, line);
    t->args = std::move(items);
    return Done(std::move(t));
  }
  ExprPtr ParsePostfix(ExprPtr node) {
    while (node) {
      int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().kind == Token::Kind::kName) {
          ExprPtr e = Make(Expr::Kind::kGetAttr, line);
          e->name = Cur().text;
          e->args.push_back(std::move(node));
          Next();
          node = Done(std::move(e));
        } else if (Cur().kind == Token::Kind::kInt) {
          ExprPtr e = Make(Expr::Kind::kGetItem, line);
          e->args.push_back(std::move(node));
          ExprPtr idx = Make(Expr::Kind::kLiteral, line);
          idx->literal = Value::Integer(Cur().int_value);
          e->args.push_back(std::move(idx));
          Next();
          node = Done(std::move(e));
        } else {
          return Fail(absl::StrCat("expected attribute name after '.', got ", Describe(Cur())));
        }
      } else if (IsOp("[")) {
        Next();
        node = ParseSubscript(std::move(node), line);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node), Expr::Kind::kCall, "");
      } else {
        break;
      }
    }
    return node;
  }
  ExprPtr ParseSubscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    int idx = 0;
    while (true) {
      if (IsOp(":")) {
        is_slice = true;
        if (++idx > 2) return Fail("too many ':' in slice");
        Next();
        continue;
      }
      if (IsOp("]")) break;
      if (IsOp(",")) return Fail("tuple subscripts are not supported");
      if (parts[idx]) return Fail(absl::StrCat("unexpected ", Describe(Cur()), " in subscript"));
      parts[idx] = ParseExpression();
      if (!parts[idx]) return nullptr;
    }
    Next();
    if (!is_slice) {
      if (!parts[0]) return Fail("empty subscript");
      ExprPtr e = Make(Expr::Kind::kGetItem, line);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(parts[0]));
      return Done(std::move(e));
    }
    ExprPtr e = Make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return Done(std::move(e));
  }
  // Parses "(args)" into a call/filter/test node whose args[0] is `subject`.
  ExprPtr ParseCall(ExprPtr subject, Expr::Kind kind, std::string name) {
    ExprPtr e = Make(kind, Cur().line);
    e->name = std::move(name);
    e->args.push_back(std::move(subject));
    if (!Expect("(")) return nullptr;
    bool first = true;
    while (!IsOp(")")) {
      if (!first && !Expect(",")) return nullptr;
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Fail("*args / **kwargs in calls are not supported");
      if (Cur().kind == Token::Kind::kName && Peek().kind == Token::Kind::kOp &&
          Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        ExprPtr v = ParseExpression();
        if (!v) return nullptr;
        e->kwargs.emplace_back(key, std::move(v));
      } else {
        if (!e->kwargs.empty()) return Fail("positional argument after keyword argument");
        ExprPtr v = ParseExpression();
        if (!v) return nullptr;
        e->args.push_back(std::move(v));
      }
    }
    Next();
    return Done(std::move(e));
  }
  std::string ParseDottedName() {
    std::string name = Cur().text;
    Next();
    while (IsOp(".") && Peek().kind == Token::Kind::kName) {
      Next();
      name += "." + Cur().text;
      Next();
    }
    return name;
  }
  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (node) {
      if (IsOp("|")) {
        Next();
        if (Cur().kind != Token::Kind::kName) {
          return Fail(absl::StrCat("expected filter name, got ", Describe(Cur())));
        }
        int line = Cur().line;
        std::string name = ParseDottedName();
        if (IsOp("(")) {
          node = ParseCall(std::move(node), Expr::Kind::kFilter, name);
        } else {
          ExprPtr e = Make(Expr::Kind::kFilter, line);
          e->name = name;
          e->args.push_back(std::move(node));
          node = Done(std::move(e));
        }
      } else if (IsName("is")) {
        int line = Cur().line;
        Next();
        bool negated = false;
        if (IsName("not")) {
          negated = true;
          Next();
        }
        if (Cur().kind != Token::Kind::kName) {
          return Fail(absl::StrCat("expected test name, got ", Describe(Cur())));
        }
        std::string name = ParseDottedName();
        ExprPtr e;
        if (IsOp("(")) {
          e = ParseCall(std::move(node), Expr::Kind::kTest, name);
          if (!e) return nullptr;
        } else {
          e = Make(Expr::Kind::kTest, line);
          e->name = name;
          e->args.push_back(std::move(node));
          const Token& t = Cur();
          bool starts_primary =
              t.kind == Token::Kind::kName || t.kind == Token::Kind::kString ||
              t.kind == Token::Kind::kInt || t.kind == Token::Kind::kFloat ||
              (t.kind == Token::Kind::kOp && (t.text == "(" || t.text == "[" || t.text == "{"));
          if (starts_primary && !IsName("else") && !IsName("or") && !IsName("and")) {
            if (IsName("is")) return Fail("You cannot chain multiple tests with is");
            ExprPtr arg = ParsePrimary();
            if (arg) arg = ParsePostfix(std::move(arg));
            if (!arg) return nullptr;
            e->args.push_back(std::move(arg));
          }
        }
        e->negated = negated;
        node = Done(std::move(e));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node), Expr::Kind::kCall, "");
      } else {
        break;
      }
    }
    return node;
  }

  // ---- statements ----
  // Assignment target: name, or names separated by commas (optionally in parentheses).
  bool ParseTargets(Stmt* s, const char* stop_name) {
    bool parens = IsOp("(");
    if (parens) Next();
    while (true) {
      if (Cur().kind != Token::Kind::kName) {
        Fail(absl::StrCat("expected a variable name, got ", Describe(Cur())));
        return false;
      }
      s->targets.push_back(Cur().text);
      Next();
      if (!IsOp(",")) break;
      s->tuple_target = true;
      Next();
      if (parens && IsOp(")")) break;
      if (!parens && stop_name && IsName(stop_name)) break;
    }
    if (parens) {
      s->tuple_target = true;
      if (!Expect(")")) return false;
    }
    return true;
  }

  // Parses chunks into `out` until a block tag named in `end_tags` (left current, its name
  // consumed; *found says which) or the end of the template (error if end_tags nonempty).
  bool ParseBody(Body* out, const std::set<std::string>& end_tags, std::string* found) {
    while (ci_ < chunks_.size()) {
      Chunk& c = chunks_[ci_];
      if (c.kind == Chunk::Kind::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kData;
        s->line = c.line;
        s->text = c.text;
        out->push_back(std::move(s));
        ++ci_;
        continue;
      }
      toks_ = &c.tokens;
      ti_ = 0;
      if (c.kind == Chunk::Kind::kPrint) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = c.line;
        s->expr = ParseTuple(true, false);
        if (!s->expr || !ExpectEnd()) return false;
        out->push_back(std::move(s));
        ++ci_;
        continue;
      }
      if (Cur().kind != Token::Kind::kName) {
        Fail(absl::StrCat("expected a tag name, got ", Describe(Cur())), c.line);
        return false;
      }
      std::string tag = Cur().text;
      if (end_tags.count(tag)) {
        Next();
        *found = tag;
        return true;
      }
      Next();
      ++ci_;
      StmtPtr s = ParseStatement(tag, c.line);
      if (!s) return false;
      out->push_back(std::move(s));
    }
    if (!end_tags.empty()) {
      std::string names;
      for (const auto& t : end_tags) names += (names.empty() ? "'" : " or '") + t + "'";
      Fail(absl::StrCat("unexpected end of template, expected ", names),
           chunks_.empty() ? 1 : chunks_.back().line);
      return false;
    }
    return true;
  }

  // Statement body parse helper: after the caller consumed the opening tag.
  StmtPtr ParseStatement(const std::string& tag, int line) {
    ScopedDepth level(nesting_);
    if (TooDeepHere(level)) return nullptr;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string found;
    if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = ParseTuple(false, false);
      if (!cond || !ExpectEnd()) return nullptr;
      while (true) {
        Body body;
        if (!ParseBody(&body, {"elif", "else", "endif"}, &found)) return nullptr;
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (found == "elif") {
          cond = ParseTuple(false, false);
          if (!cond || !ExpectEnd()) return nullptr;
          ++ci_;
          continue;
        }
        if (!ExpectEnd()) return nullptr;
        ++ci_;
        if (found == "else") {
          if (!ParseBody(&s->else_body, {"endif"}, &found) || !ExpectEnd()) return nullptr;
          ++ci_;
        }
        return s;
      }
    }
    if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      if (!ParseTargets(s.get(), "in")) return nullptr;
      if (!IsName("in")) return Fail(absl::StrCat("expected 'in', got ", Describe(Cur())));
      Next();
      s->expr = ParseTuple(false, false, {"if", "recursive"});
      if (!s->expr) return nullptr;
      if (IsName("if")) {
        Next();
        s->filter = ParseExpression();
        if (!s->filter) return nullptr;
      }
      if (IsName("recursive")) return Fail("unsupported construct: recursive for loops");
      if (!ExpectEnd()) return nullptr;
      if (!ParseBody(&s->body, {"endfor", "else"}, &found) || !ExpectEnd()) return nullptr;
      ++ci_;
      if (found == "else") {
        if (!ParseBody(&s->else_body, {"endfor"}, &found) || !ExpectEnd()) return nullptr;
        ++ci_;
      }
      return s;
    }
    if (tag == "set") {
      if (Cur().kind == Token::Kind::kName && Peek().kind == Token::Kind::kOp &&
          Peek().text == "." && Peek(2).kind == Token::Kind::kName) {
        s->kind = Stmt::Kind::kSetAttr;
        s->targets.push_back(Cur().text);
        s->targets.push_back(Peek(2).text);
        Next();
        Next();
        Next();
        if (!Expect("=")) return nullptr;
        s->expr = ParseTuple(true, false);
        if (!s->expr || !ExpectEnd()) return nullptr;
        return s;
      }
      if (!ParseTargets(s.get(), nullptr)) return nullptr;
      if (IsOp("=")) {
        s->kind = Stmt::Kind::kSet;
        Next();
        s->expr = ParseTuple(true, false);
        if (!s->expr || !ExpectEnd()) return nullptr;
        return s;
      }
      if (IsOp("|")) return Fail("unsupported construct: filtered {% set %} blocks");
      if (s->tuple_target) return Fail("a {% set %} block takes a single name");
      if (!ExpectEnd()) return nullptr;
      s->kind = Stmt::Kind::kSetBlock;
      if (!ParseBody(&s->body, {"endset"}, &found) || !ExpectEnd()) return nullptr;
      ++ci_;
      return s;
    }
    if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      if (Cur().kind != Token::Kind::kName) {
        return Fail(absl::StrCat("expected macro name, got ", Describe(Cur())));
      }
      s->text = Cur().text;
      Next();
      if (!Expect("(")) return nullptr;
      while (!IsOp(")")) {
        if (!s->params.empty() && !Expect(",")) return nullptr;
        if (IsOp(")")) break;
        if (Cur().kind != Token::Kind::kName) {
          return Fail(absl::StrCat("expected parameter name, got ", Describe(Cur())));
        }
        std::string pname = Cur().text;
        Next();
        ExprPtr dflt;
        if (IsOp("=")) {
          Next();
          dflt = ParseExpression();
          if (!dflt) return nullptr;
        }
        s->params.emplace_back(pname, std::move(dflt));
      }
      Next();
      if (!ExpectEnd()) return nullptr;
      if (!ParseBody(&s->body, {"endmacro"}, &found)) return nullptr;
      if (Cur().kind == Token::Kind::kName) Next();  // {% endmacro name %}
      if (!ExpectEnd()) return nullptr;
      ++ci_;
      return s;
    }
    if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      if (!ExpectEnd()) return nullptr;
      return s;
    }
    if (tag == "generation") {
      s->kind = Stmt::Kind::kScope;
      if (!ExpectEnd()) return nullptr;
      if (!ParseBody(&s->body, {"endgeneration"}, &found) || !ExpectEnd()) return nullptr;
      ++ci_;
      return s;
    }
    static const std::set<std::string> kStray = {"endif",  "endfor",   "else",          "elif",
                                                 "endset", "endmacro", "endgeneration", "endraw"};
    if (kStray.count(tag)) return Fail(absl::StrCat("unexpected '", tag, "' tag"), line);
    return Fail(absl::StrCat("unsupported construct: tag '", tag, "'"), line);
  }

  std::vector<Chunk> chunks_;
  size_t ci_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;
  int nesting_ = 0;  // see TooDeepHere
  absl::Status error_;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(const std::string& source) {
  auto chunks = Lex(source);
  if (!chunks.ok()) return chunks.status();
  Parser parser(*std::move(chunks));
  return parser.Parse();
}

}  // namespace ringserve::chat::jinja
