// A port of the part of jinja2/idtracking.py that decides how each frame-local name starts
// out (resolved from the context, aliased to the parent frame's, or undefined).
#include <map>
#include <set>

#include "coordinator/chat/jinja_ast.h"

namespace ringserve::chat::jinja {
namespace {

enum class Load { kResolve, kUndefined, kAlias, kParameter };

struct Symbols {
  const Symbols* parent = nullptr;
  std::map<std::string, Load> refs;
  std::set<std::string> stores;

  bool FindRef(const std::string& name) const {
    if (refs.count(name)) return true;
    return parent != nullptr && parent->FindRef(name);
  }
  void LoadName(const std::string& name) {
    if (!FindRef(name)) refs[name] = Load::kResolve;
  }
  void Store(const std::string& name) {
    stores.insert(name);
    if (refs.count(name)) return;
    refs[name] = parent != nullptr && parent->FindRef(name) ? Load::kAlias : Load::kUndefined;
  }
  void Param(const std::string& name) {
    stores.insert(name);
    refs[name] = Load::kParameter;
  }
  void BranchUpdate(const std::vector<Symbols>& branches) {
    std::map<std::string, size_t> counts;
    for (const Symbols& b : branches) {
      for (const std::string& t : b.stores) {
        if (!stores.count(t)) ++counts[t];
      }
    }
    for (const Symbols& b : branches) {
      for (const auto& [k, v] : b.refs) refs[k] = v;
      stores.insert(b.stores.begin(), b.stores.end());
    }
    for (const auto& [name, n] : counts) {
      if (n == branches.size()) continue;
      refs[name] = parent != nullptr && parent->FindRef(name) ? Load::kAlias : Load::kResolve;
    }
  }
  std::vector<std::string> Undefined() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : refs) {
      if (v == Load::kUndefined) out.push_back(k);
    }
    return out;
  }
};

void VisitExpr(const Expr& e, Symbols* s) {
  if (e.kind == Expr::Kind::kName) s->LoadName(e.name);
  for (const auto& a : e.args) {
    if (a) VisitExpr(*a, s);
  }
  for (const auto& kv : e.kwargs) {
    if (kv.second) VisitExpr(*kv.second, s);
  }
}

void VisitBody(const Body& body, Symbols* s);

// Jinja's If node nests elifs: test, body, [elif nodes...], else.
void VisitIf(const Stmt& st, size_t branch, bool with_else, Symbols* s) {
  VisitExpr(*st.branches[branch].first, s);
  std::vector<Symbols> parts(3, *s);
  VisitBody(st.branches[branch].second, &parts[0]);
  if (branch + 1 < st.branches.size()) VisitIf(st, branch + 1, false, &parts[1]);
  if (with_else) VisitBody(st.else_body, &parts[2]);
  s->BranchUpdate(parts);
}

void VisitBody(const Body& body, Symbols* s) {
  for (const auto& st : body) {
    switch (st->kind) {
      case Stmt::Kind::kPrint:
        VisitExpr(*st->expr, s);
        break;
      case Stmt::Kind::kIf:
        VisitIf(*st, 0, true, s);
        break;
      case Stmt::Kind::kFor:
        VisitExpr(*st->expr, s);
        break;
      case Stmt::Kind::kSet:
        VisitExpr(*st->expr, s);
        for (const auto& t : st->targets) s->Store(t);
        break;
      case Stmt::Kind::kSetAttr:
        VisitExpr(*st->expr, s);
        s->LoadName(st->targets[0]);
        break;
      case Stmt::Kind::kSetBlock:
      case Stmt::Kind::kMacro:
        s->Store(st->kind == Stmt::Kind::kMacro ? st->text : st->targets[0]);
        break;
      default:
        break;
    }
  }
}

void AnalyzeChildren(Body& body, const Symbols& frame);

// Analyzes one child frame of `parent`, then its own children.
std::vector<std::string> AnalyzeFrame(Body& body, const std::vector<std::string>& params,
                                      const Symbols& parent) {
  Symbols s;
  s.parent = &parent;
  for (const auto& p : params) s.Param(p);
  VisitBody(body, &s);
  AnalyzeChildren(body, s);
  return s.Undefined();
}

void AnalyzeChildren(Body& body, const Symbols& frame) {
  for (auto& st : body) {
    switch (st->kind) {
      case Stmt::Kind::kIf:
        for (auto& [cond, b] : st->branches) AnalyzeChildren(b, frame);
        AnalyzeChildren(st->else_body, frame);
        break;
      case Stmt::Kind::kFor: {
        std::vector<std::string> params = st->targets;
        params.push_back("loop");
        st->frame_undefined = AnalyzeFrame(st->body, params, frame);
        st->else_frame_undefined = AnalyzeFrame(st->else_body, {}, frame);
        break;
      }
      case Stmt::Kind::kMacro: {
        std::vector<std::string> params;
        for (const auto& p : st->params) params.push_back(p.first);
        st->frame_undefined = AnalyzeFrame(st->body, params, frame);
        break;
      }
      case Stmt::Kind::kSetBlock:
      case Stmt::Kind::kScope:
        st->frame_undefined = AnalyzeFrame(st->body, {}, frame);
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::vector<std::string> AnalyzeScopes(Body& root) {
  Symbols s;
  VisitBody(root, &s);
  AnalyzeChildren(root, s);
  return s.Undefined();
}

}  // namespace ringserve::chat::jinja
