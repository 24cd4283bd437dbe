// Filters and tests, following jinja2/filters.py and jinja2/tests.py (3.1), with
// transformers' own `tojson` (json.dumps, ensure_ascii=False unless asked).
#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_builtins.h"
#include "coordinator/chat/jinja_internal.h"

namespace ringserve::chat::jinja {
namespace {

// Jinja's make_attrgetter: "a.b.0" -> getitem chain.
absl::StatusOr<Value> GetPath(const Value& item, const Value& attribute) {
  if (attribute.kind() == Value::Kind::kInt) return GetItem(item, attribute);
  std::string path = ToPyStr(attribute);
  Value cur = item;
  size_t b = 0;
  while (true) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    Value key = Value::String(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      key = Value::Integer(std::strtoll(part.c_str(), nullptr, 10));
    }
    auto next = GetItem(cur, key);
    if (!next.ok()) return next.status();
    cur = *std::move(next);
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PyCaseMap(v.str(), 0));
  return v;
}

// Stable sort by key; errors when keys do not compare.
absl::Status SortValues(std::vector<Value>* items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> idx(items->size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  absl::Status error;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    auto lt = reverse ? PyLess(keys[y], keys[x]) : PyLess(keys[x], keys[y]);
    if (!lt.ok()) {
      if (error.ok()) error = lt.status();
      return false;
    }
    return *lt;
  });
  if (!error.ok()) return error;
  std::vector<Value> out;
  for (size_t i : idx) out.push_back((*items)[i]);
  *items = std::move(out);
  return absl::OkStatus();
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python int(str, base 10) / float(str) parsing for the int/float filters.
bool ParseInt(const std::string& raw, Int* out) {
  std::string s = PyStrip(raw, Value::None(), true, true);
  std::string t;
  for (char c : s) {
    if (c != '_') t.push_back(c);
  }
  if (t.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    i = 1;
  }
  if (i >= t.size()) return false;
  Int v = 0;
  for (; i < t.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
    if (v > (Int(1) << 120)) return false;
    v = v * 10 + (t[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

bool ParseFloat(const std::string& raw, double* out) {
  std::string s = PyStrip(raw, Value::None(), true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = d;
  return true;
}

absl::StatusOr<Value> ToList(const Value& v) {
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  return Value::MakeList(*std::move(items));
}

absl::StatusOr<Value> SelectOrReject(const std::string& name, const Value& subject,
                                     CallArgs& args) {
  const bool attr_mode = name == "selectattr" || name == "rejectattr";
  const bool select = name == "select" || name == "selectattr";
  auto items = Iterate(subject);
  if (!items.ok()) return Value::MakeFailingIterator(items.status());
  size_t first_test_arg = attr_mode ? 1 : 0;
  if (attr_mode && args.positional.empty()) return TypeError(name + ": missing attribute");
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > first_test_arg) {
    test = ToPyStr(args.positional[first_test_arg]);
    test_args.positional.assign(args.positional.begin() + first_test_arg + 1,
                                args.positional.end());
    test_args.keyword = args.keyword;
  }
  Value::List out;
  for (const Value& item : *items) {
    Value x = item;
    if (attr_mode) {
      auto got = GetPath(item, args.positional[0]);
      if (!got.ok()) return got.status();
      x = *std::move(got);
    }
    bool hit;
    if (test.empty()) {
      hit = x.Truthy();
    } else {
      CallArgs a = test_args;
      auto r = ApplyTest(test, x, a);
      if (!r.ok()) return r.status();
      hit = *r;
    }
    if (hit == select) out.push_back(item);
  }
  return Value::MakeIterator(std::move(out), "generator");
}

absl::StatusOr<Value> MapFilter(const Value& subject, CallArgs& args) {
  auto items = Iterate(subject);
  if (!items.ok()) return Value::MakeFailingIterator(items.status());
  Value::List out;
  Value attribute = Arg(args, 99, "attribute", Value());
  if (!attribute.is_undefined()) {
    Value dflt = Arg(args, 99, "default", Value());
    for (const Value& item : *items) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && !dflt.is_undefined() ? dflt : *got);
    }
    return Value::MakeIterator(std::move(out), "generator");
  }
  if (args.positional.empty()) return TypeError("map: expected a filter name or attribute=");
  std::string filter = ToPyStr(args.positional[0]);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : *items) {
    CallArgs a = rest;
    auto r = ApplyFilter(filter, item, a);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return Value::MakeIterator(std::move(out), "generator");
}

absl::StatusOr<Value> ToJson(const Value& subject, CallArgs& args) {
  if (auto st = CheckArgs(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
      !st.ok()) {
    return st;
  }
  JsonDumpOptions o;
  o.ensure_ascii = Arg(args, 0, "ensure_ascii", Value::Bool(false)).Truthy();
  Value indent = Arg(args, 1, "indent", Value::None());
  if (indent.kind() == Value::Kind::kInt) {
    o.indent = static_cast<int>(std::clamp<Int>(indent.int_value(), 0, 64));
    if (indent.int_value() < 0) o.indent = 0;
  } else if (!indent.is_none()) {
    return TypeError("unsupported construct: tojson indent must be an integer");
  }
  Value seps = Arg(args, 2, "separators", Value::None());
  if (seps.is_sequence() && seps.list().size() == 2 && seps.list()[0].is_string() &&
      seps.list()[1].is_string()) {
    o.has_separators = true;
    o.item_separator = seps.list()[0].str();
    o.key_separator = seps.list()[1].str();
  } else if (!seps.is_none()) {
    return TypeError("tojson separators must be a pair of strings");
  }
  o.sort_keys = Arg(args, 3, "sort_keys", Value::Bool(false)).Truthy();
  auto s = JsonDumps(subject, o);
  if (!s.ok()) return s.status();
  return Value::String(*std::move(s));
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& args) {
  // Most filters read their string subject whole (trim, upper, wordcount, ...). Filters that
  // loop (map, sum, ...) call filters and operators: they stop once the render has failed.
  if (!ChargeScan(v.is_string() ? v.str().size() : 0)) return RenderError();
  if (name == "default" || name == "d") {
    Value dflt = Arg(args, 0, "default_value", Value::String(""));
    bool boolean = Arg(args, 1, "boolean", Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return dflt;
    return v;
  }
  if (name == "tojson") return ToJson(v, args);
  if (name == "trim") {
    Value chars = Arg(args, 0, "chars", Value::None());
    return Value::String(PyStrip(ToPyStr(v), chars, true, true));
  }
  if (name == "length" || name == "count") {
    auto n = Length(v);
    if (!n.ok()) return n.status();
    return Value::Integer(*n);
  }
  if (name == "string") return Value::String(ToPyStr(v));
  if (name == "safe") return Value::String(ToPyStr(v));  // Markup(str(value))
  if (name == "escape" || name == "e") return Value::String(HtmlEscape(ToPyStr(v)));
  if (name == "upper") return Value::String(PyCaseMap(ToPyStr(v), 1));
  if (name == "lower") return Value::String(PyCaseMap(ToPyStr(v), 0));
  if (name == "capitalize") return Value::String(PyCaseMap(ToPyStr(v), 3));
  if (name == "title") {
    // Jinja splits before runs of [-\s({\[<] and upper-cases each piece's first letter.
    std::u32string u = ToU32(ToPyStr(v));
    std::string out;
    auto is_sep = [](char32_t c) {
      return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    };
    size_t i = 0;
    while (i < u.size()) {
      size_t j = i;
      bool sep = is_sep(u[i]);
      while (j < u.size() && is_sep(u[j]) == sep) ++j;
      std::string piece = FromU32(u.substr(i, j - i));
      if (sep) {
        out += piece;
      } else {
        std::u32string p = u.substr(i, j - i);
        out += PyCaseMap(FromU32(p.substr(0, 1)), 1) + PyCaseMap(FromU32(p.substr(1)), 0);
      }
      i = j;
    }
    return Value::String(out);
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.kind() == Value::Kind::kIterator) {
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not reversible"));
    }
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) {
      return Value::Undefined(absl::StrCat("No ", name, " item, sequence was empty."));
    }
    return name == "first" ? items->front() : items->back();
  }
  if (name == "join") {
    Value sep = Arg(args, 0, "d", Value::String(""));
    Value attribute = Arg(args, 1, "attribute", Value::None());
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      Value x = (*items)[i];
      if (!attribute.is_none()) {
        auto got = GetPath(x, attribute);
        if (!got.ok()) return got.status();
        x = *got;
      }
      if (i > 0) out += ToPyStr(sep);
      out += ToPyStr(x);
      if (out.size() > kMaxStringBytes) return TypeError("join result too large");
    }
    return Value::String(out);
  }
  if (name == "list") return ToList(v);
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeIterator({}, "generator");
    if (v.kind() != Value::Kind::kDict) {
      return Value::MakeFailingIterator(
          TypeError(absl::StrCat("Can only get item pairs from a mapping, got ", v.TypeName())));
    }
    Value::List out;
    for (const auto& [k, e] : v.dict()) out.push_back(Value::MakeTuple({Value::String(k), e}));
    return Value::MakeIterator(std::move(out), "generator");
  }
  if (name == "dictsort") {
    if (v.kind() != Value::Kind::kDict) return TypeError("dictsort: expected a mapping");
    bool cs = Arg(args, 0, "case_sensitive", Value::Bool(false)).Truthy();
    std::string by = ToPyStr(Arg(args, 1, "by", Value::String("key")));
    bool reverse = Arg(args, 2, "reverse", Value::Bool(false)).Truthy();
    std::vector<Value> items, keys;
    for (const auto& [k, e] : v.dict()) {
      items.push_back(Value::MakeTuple({Value::String(k), e}));
      keys.push_back(IgnoreCase(by == "value" ? e : Value::String(k), cs));
    }
    if (auto st = SortValues(&items, keys, reverse); !st.ok()) return st;
    return Value::MakeList(std::move(items));
  }
  if (name == "map") return MapFilter(v, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(name, v, args);
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    bool reverse = false;
    bool cs = false;
    Value attribute;
    if (name == "sort") {
      reverse = Arg(args, 0, "reverse", Value::Bool(false)).Truthy();
      cs = Arg(args, 1, "case_sensitive", Value::Bool(false)).Truthy();
      attribute = Arg(args, 2, "attribute", Value::None());
    } else {
      cs = Arg(args, 0, "case_sensitive", Value::Bool(false)).Truthy();
      attribute = Arg(args, 1, "attribute", Value::None());
    }
    auto items = Iterate(v);
    if (!items.ok()) {
      if (name == "unique") return Value::MakeFailingIterator(items.status());
      return items.status();
    }
    std::vector<Value> keys;
    for (const Value& x : *items) {
      Value k = x;
      if (!attribute.is_none() && !attribute.is_undefined()) {
        auto got = GetPath(x, attribute);
        if (!got.ok()) return got.status();
        k = *got;
      }
      keys.push_back(IgnoreCase(k, cs));
    }
    if (name == "unique") {
      Value::List out;
      std::vector<Value> seen;
      for (size_t i = 0; i < items->size(); ++i) {
        bool dup = false;
        for (size_t j = 0; j < seen.size() && !dup; ++j) dup = PyEquals(seen[j], keys[i]);
        if (!RenderOk()) return RenderError();  // quadratic: stop once the budget is spent
        if (dup) continue;
        seen.push_back(keys[i]);
        out.push_back((*items)[i]);
      }
      return Value::MakeIterator(std::move(out), "generator");
    }
    if (name == "sort") {
      std::vector<Value> sorted = *items;
      if (auto st = SortValues(&sorted, keys, reverse); !st.ok()) return st;
      return Value::MakeList(std::move(sorted));
    }
    if (items->empty()) return Value::Undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < items->size(); ++i) {
      auto lt = name == "min" ? PyLess(keys[i], keys[best]) : PyLess(keys[best], keys[i]);
      if (!lt.ok()) return lt.status();
      if (*lt) best = i;
    }
    return (*items)[best];
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = DecodeUtf8(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::String(EncodeUtf8(cps));
    }
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    // reversed(list) is an iterator; an iterator cannot be reversed, so Jinja makes a list.
    if (v.kind() == Value::Kind::kIterator) return Value::MakeList(*std::move(items));
    return Value::MakeIterator(*std::move(items), v.kind() == Value::Kind::kDict
                                                      ? "dict_reversekeyiterator"
                                                      : "list_reverseiterator");
  }
  if (name == "sum") {
    Value attribute = Arg(args, 0, "attribute", Value::None());
    Value total = Arg(args, 1, "start", Value::Integer(0));
    auto items = Iterate(v);
    if (!items.ok()) return items.status();
    for (const Value& x : *items) {
      Value k = x;
      if (!attribute.is_none()) {
        auto got = GetPath(x, attribute);
        if (!got.ok()) return got.status();
        k = *got;
      }
      auto s = BinaryOp("+", total, k);
      if (!s.ok()) return s.status();
      total = *std::move(s);
    }
    return total;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
    if (v.is_number()) return Value::Integer(v.int_value() < 0 ? -v.int_value() : v.int_value());
    return TypeError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (name == "int") {
    Value dflt = Arg(args, 0, "default", Value::Integer(0));
    if (v.is_undefined()) return UndefinedError(v);
    if (v.kind() == Value::Kind::kInt) return v;
    if (v.is_bool()) return Value::Integer(v.int_value());
    if (v.kind() == Value::Kind::kFloat) {
      if (!std::isfinite(v.float_value())) return dflt;
      return Value::Integer(static_cast<Int>(std::trunc(v.float_value())));
    }
    if (v.is_string()) {
      Int i;
      if (ParseInt(v.str(), &i)) return Value::Integer(i);
      double d;
      if (ParseFloat(v.str(), &d) && std::isfinite(d)) {
        return Value::Integer(static_cast<Int>(std::trunc(d)));
      }
    }
    return dflt;
  }
  if (name == "float") {
    Value dflt = Arg(args, 0, "default", Value::Float(0.0));
    if (v.is_undefined()) return UndefinedError(v);
    if (v.is_number()) return Value::Float(v.AsDouble());
    double d;
    if (v.is_string() && ParseFloat(v.str(), &d)) return Value::Float(d);
    return dflt;
  }
  if (name == "replace") {
    CallArgs a;
    a.positional = {Arg(args, 0, "old", Value()), Arg(args, 1, "new", Value())};
    Value count = Arg(args, 2, "count", Value::None());
    if (!count.is_none()) a.positional.push_back(count);
    auto method = GetAttr(Value::String(ToPyStr(v)), "replace");
    if (!method.ok()) return method.status();
    return method->function()(a);
  }
  if (name == "center") {
    Value width = Arg(args, 0, "width", Value::Integer(80));
    std::u32string u = ToU32(ToPyStr(v));
    Int w = width.int_value();
    if (w <= static_cast<Int>(u.size())) return Value::String(FromU32(u));
    if (w > static_cast<Int>(kMaxStringBytes)) return TypeError("center result too large");
    Int pad = w - static_cast<Int>(u.size());
    Int left = pad / 2 + (pad & w & 1);
    return Value::String(std::string(static_cast<size_t>(left), ' ') + FromU32(u) +
                         std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "indent") {
    Value width = Arg(args, 0, "width", Value::Integer(4));
    bool first = Arg(args, 1, "first", Value::Bool(false)).Truthy();
    bool blank = Arg(args, 2, "blank", Value::Bool(false)).Truthy();
    if (!v.is_string()) {  // Jinja does `s += "\n"` first
      return TypeError(absl::StrCat("indent: expected a string, got ", v.TypeName()));
    }
    std::string indention =
        width.is_string()
            ? width.str()
            : std::string(
                  static_cast<size_t>(std::max<Int>(0, std::min<Int>(width.int_value(), 4096))),
                  ' ');
    CallArgs none;
    auto lines_v = GetAttr(Value::String(ToPyStr(v) + "\n"), "splitlines");
    if (!lines_v.ok()) return lines_v.status();
    auto lines = lines_v->function()(none);
    if (!lines.ok()) return lines.status();
    const auto& ls = lines->list();
    std::string rv;
    if (blank) {
      for (size_t i = 0; i < ls.size(); ++i) {
        rv += (i > 0 ? "\n" + indention : "") + ls[i].str();
        if (rv.size() > kMaxStringBytes) return TypeError("indent result too large");
      }
    } else {
      rv = ls.empty() ? "" : ls[0].str();
      for (size_t i = 1; i < ls.size(); ++i) {
        rv += "\n" + (ls[i].str().empty() ? "" : indention + ls[i].str());
        if (rv.size() > kMaxStringBytes) return TypeError("indent result too large");
      }
    }
    if (first) rv = indention + rv;
    return Value::String(rv);
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : DecodeUtf8(ToPyStr(v))) {
      bool w = u_isalnum(c) || c == '_';
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::Integer(n);
  }
  if (name == "attr") {
    return GetAttr(v, ToPyStr(Arg(args, 0, "name", Value())));
  }
  if (name == "round") {
    Value precision = Arg(args, 0, "precision", Value::Integer(0));
    std::string method = ToPyStr(Arg(args, 1, "method", Value::String("common")));
    if (!v.is_number()) return TypeError("round: expected a number");
    double scale = std::pow(10.0, static_cast<double>(precision.int_value()));
    double x = v.AsDouble() * scale;
    if (method == "common") {
      x = std::nearbyint(x);  // Python round(): half to even
    } else if (method == "ceil") {
      x = std::ceil(x);
    } else if (method == "floor") {
      x = std::floor(x);
    } else {
      return TypeError("method must be common, ceil or floor");
    }
    return Value::Float(x / scale);
  }
  return TypeError(absl::StrCat("unsupported construct: no filter named '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& args) {
  using K = Value::Kind;
  static const std::set<std::string> kOneArg = {
      "divisibleby", "eq",          "equalto", "==", "ne", "!=", "lt", "lessthan", "<",
      "gt",          "greaterthan", ">",       "le", "<=", "ge", ">=", "in",       "sameas"};
  const size_t max_args = kOneArg.count(name) ? 1 : 0;
  if (args.positional.size() + args.keyword.size() > max_args) {
    return TypeError(absl::StrCat("test_", name, "() takes ", max_args + 1,
                                  " positional argument(s) but ",
                                  args.positional.size() + args.keyword.size() + 1, " were given"));
  }
  if (!ChargeScan(v.is_string() ? v.str().size() : 0)) return RenderError();
  Value other = Arg(args, 0, "value", Value());
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "mapping") return v.kind() == K::kDict;
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == K::kDict ||
           v.kind() == K::kIterator;
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == K::kDict;
  }
  if (name == "callable") return v.kind() == K::kFunction;
  if (name == "escaped") return false;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value mod = name == "divisibleby" ? Arg(args, 0, "num", Value()) : Value::Integer(2);
    auto r = BinaryOp("%", v, mod);
    if (!r.ok()) return r.status();
    return PyEquals(*r, Value::Integer(name == "odd" ? 1 : 0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return PyEquals(v, other);
  if (name == "ne" || name == "!=") return !PyEquals(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return PyLess(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return PyLess(other, v);
  if (name == "le" || name == "<=") {
    auto r = PyLess(other, v);
    if (!r.ok()) return r.status();
    return !*r;
  }
  if (name == "ge" || name == ">=") {
    auto r = PyLess(v, other);
    if (!r.ok()) return r.status();
    return !*r;
  }
  if (name == "in") return Contains(Arg(args, 0, "seq", Value()), v);
  if (name == "lower" || name == "upper") {
    CallArgs none;
    auto m = GetAttr(Value::String(ToPyStr(v)), name == "lower" ? "islower" : "isupper");
    if (!m.ok()) return m.status();
    auto r = m->function()(none);
    if (!r.ok()) return r.status();
    return r->Truthy();
  }
  if (name == "sameas") {
    if (v.kind() != other.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.bool_value() == other.bool_value();
    if (v.is_sequence()) return &v.list() == &other.list();
    if (v.is_mapping()) return &v.dict() == &other.dict();
    return PyEquals(v, other);
  }
  return TypeError(absl::StrCat("unsupported construct: no test named '", name, "'"));
}

}  // namespace ringserve::chat::jinja
