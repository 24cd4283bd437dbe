// Attribute/item lookup, str/dict/list methods, operators and iteration with the semantics
// of Python values inside Jinja's ImmutableSandboxedEnvironment (what transformers uses).
#include <unicode/uchar.h>

#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_builtins.h"
#include "coordinator/chat/jinja_internal.h"

namespace ringserve::chat::jinja {

absl::Status TypeError(const std::string& msg) { return absl::InvalidArgumentError(msg); }

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.str().empty() ? "value is undefined" : v.str());
}

Value Arg(const CallArgs& args, size_t index, const char* name, Value dflt) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return v;
  }
  return dflt;
}

absl::Status CheckArgs(const CallArgs& args, const std::string& fname,
                       std::initializer_list<const char*> names) {
  if (args.positional.size() > names.size()) {
    return TypeError(absl::StrCat(fname, "() takes at most ", names.size(), " arguments (",
                                  args.positional.size(), " given)"));
  }
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const char* n : names) known = known || k == n;
    if (!known) {
      return TypeError(absl::StrCat(fname, "() got an unexpected keyword argument '", k, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ArgString(const Value& v, const std::string& fname) {
  if (!v.is_string()) {
    return TypeError(absl::StrCat(fname, ": expected a string argument, got ", v.TypeName()));
  }
  return v.str();
}

std::u32string ToU32(const std::string& s) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  return std::u32string(cps.begin(), cps.end());
}
std::string FromU32(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string u = ToU32(s);
  std::u32string set;
  bool use_set = chars.is_string();
  if (use_set) set = ToU32(chars.str());
  auto strip = [&](char32_t c) {
    return use_set ? set.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip(u[e - 1])) --e;
  }
  return FromU32(u.substr(b, e - b));
}

std::string PyCaseMap(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 cap
  std::string out;
  bool prev_cased = false;
  bool first = true;
  for (char32_t c : DecodeUtf8(s)) {
    char32_t m = c;
    switch (mode) {
      case 0:
        m = u_tolower(c);
        break;
      case 1:
        m = u_toupper(c);
        break;
      case 2:
        m = prev_cased ? u_tolower(c) : u_totitle(c);
        break;
      case 3:
        m = first ? u_totitle(c) : u_tolower(c);
        break;
    }
    bool cased = u_hasBinaryProperty(c, UCHAR_CASED);
    prev_cased = cased || (prev_cased && u_hasBinaryProperty(c, UCHAR_CASE_IGNORABLE));
    first = false;
    AppendUtf8(m, &out);
  }
  return out;
}

namespace {

std::vector<std::string> PySplit(const std::string& s, const Value& sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> parts;
  if (!sep.is_string()) {
    std::u32string u = ToU32(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < u.size() && IsPySpace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = u.size();
          while (e > i && IsPySpace(u[e - 1])) --e;
          words.push_back(u.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < u.size() && !IsPySpace(u[j])) ++j;
        words.push_back(u.substr(i, j - i));
        i = j;
      }
    } else {
      size_t i = u.size();
      while (true) {
        while (i > 0 && IsPySpace(u[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t b = 0;
          while (b < i && IsPySpace(u[b])) ++b;
          words.push_back(u.substr(b, i - b));
          break;
        }
        size_t j = i;
        while (j > 0 && !IsPySpace(u[j - 1])) --j;
        words.push_back(u.substr(j, i - j));
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) parts.push_back(FromU32(w));
    return parts;
  }
  const std::string& d = sep.str();
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t f = s.find(d, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < d.size()) break;
      size_t f = s.rfind(d, end - d.size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + d.size(), end - f - d.size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  return parts;
}

Value StringList(const std::vector<std::string>& parts) {
  Value::List items;
  for (const auto& p : parts) items.push_back(Value::String(p));
  return Value::MakeList(std::move(items));
}

int64_t CountOccurrences(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointLength(s)) + 1;
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

// Byte offset -> code point index.
int64_t CpIndex(const std::string& s, size_t byte) {
  return static_cast<int64_t>(CodePointLength(s.substr(0, byte)));
}

absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name, CallArgs& args) {
  const std::string f = "str." + name;
  if (!ChargeScan(s.size())) return RenderError();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    if (auto st = CheckArgs(args, f, {"chars"}); !st.ok()) return st;
    Value chars = Arg(args, 0, "chars", Value::None());
    if (!chars.is_string() && !chars.is_none()) return TypeError(f + " arg must be None or str");
    return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    if (auto st = CheckArgs(args, f, {"sep", "maxsplit"}); !st.ok()) return st;
    Value sep = Arg(args, 0, "sep", Value::None());
    Value maxsplit = Arg(args, 1, "maxsplit", Value::Integer(-1));
    if (!sep.is_none() && !sep.is_string()) return TypeError("must be str or None");
    if (sep.is_string() && sep.str().empty()) return TypeError("empty separator");
    if (maxsplit.kind() != Value::Kind::kInt) return TypeError("maxsplit must be an integer");
    if (sep.is_string() && !ChargeSearch(s.size(), sep.str().size())) return RenderError();
    return StringList(
        PySplit(s, sep, static_cast<int64_t>(maxsplit.int_value()), name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    if (auto st = CheckArgs(args, f, {"prefix"}); !st.ok()) return st;
    Value p = Arg(args, 0, "prefix", Value());
    std::vector<Value> cands;
    if (p.is_string()) {
      cands.push_back(p);
    } else if (p.kind() == Value::Kind::kTuple) {
      cands = p.list();
    } else {
      return TypeError(
          absl::StrCat(name, " first arg must be str or a tuple of str, not ", p.TypeName()));
    }
    for (const Value& c : cands) {
      if (!c.is_string()) return TypeError(name + " tuple items must be str");
      const std::string& x = c.str();
      bool hit = name == "startswith"
                     ? s.compare(0, x.size(), x) == 0
                     : (s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "replace") {
    if (auto st = CheckArgs(args, f, {"old", "new", "count"}); !st.ok()) return st;
    auto old_s = ArgString(Arg(args, 0, "old", Value()), f);
    auto new_s = ArgString(Arg(args, 1, "new", Value()), f);
    if (!old_s.ok()) return old_s.status();
    if (!new_s.ok()) return new_s.status();
    Value count = Arg(args, 2, "count", Value::Integer(-1));
    int64_t n = static_cast<int64_t>(count.int_value());
    if (!ChargeSearch(s.size(), old_s->size())) return RenderError();
    std::string out;
    if (old_s->empty()) {
      std::vector<char32_t> cps = DecodeUtf8(s);
      int64_t done = 0;
      for (char32_t c : cps) {
        if (n < 0 || done < n) {
          out += *new_s;
          ++done;
        }
        AppendUtf8(c, &out);
        if (out.size() > kMaxStringBytes) return TypeError("replace result too large");
      }
      if (n < 0 || done < n) out += *new_s;
      return Value::String(out);
    }
    size_t pos = 0;
    int64_t done = 0;
    while (n < 0 || done < n) {
      size_t fnd = s.find(*old_s, pos);
      if (fnd == std::string::npos) break;
      out += s.substr(pos, fnd - pos) + *new_s;
      if (out.size() > kMaxStringBytes) return TypeError("replace result too large");
      pos = fnd + old_s->size();
      ++done;
    }
    out += s.substr(pos);
    return Value::String(out);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    if (auto st = CheckArgs(args, f, {}); !st.ok()) return st;
    int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "title" ? 2 : 3;
    return Value::String(PyCaseMap(s, mode));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    if (auto st = CheckArgs(args, f, {"sub"}); !st.ok()) return st;
    auto sub = ArgString(Arg(args, 0, "sub", Value()), f);
    if (!sub.ok()) return sub.status();
    if (!ChargeSearch(s.size(), sub->size())) return RenderError();
    if (name == "count") return Value::Integer(CountOccurrences(s, *sub));
    size_t p = name == "rfind" ? s.rfind(*sub) : s.find(*sub);
    if (p == std::string::npos) {
      if (name == "index") return TypeError("substring not found");
      return Value::Integer(-1);
    }
    return Value::Integer(CpIndex(s, p));
  }
  if (name == "join") {
    if (auto st = CheckArgs(args, f, {"iterable"}); !st.ok()) return st;
    auto items = Iterate(Arg(args, 0, "iterable", Value()));
    if (!items.ok()) return items.status();
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (!(*items)[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                      (*items)[i].TypeName(), " found"));
      }
      if (i > 0) out += s;
      out += (*items)[i].str();
      if (out.size() > kMaxStringBytes) return TypeError("join result too large");
    }
    return Value::String(out);
  }
  if (name == "splitlines") {
    if (auto st = CheckArgs(args, f, {"keepends"}); !st.ok()) return st;
    bool keep = Arg(args, 0, "keepends", Value::Bool(false)).Truthy();
    std::vector<std::string> lines;
    std::u32string u = ToU32(s);
    size_t b = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      char32_t c = u[i];
      bool brk = c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D ||
                 c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!brk) continue;
      size_t eol = i + 1;
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') eol = i + 2;
      lines.push_back(FromU32(u.substr(b, (keep ? eol : i) - b)));
      b = eol;
      i = eol - 1;
    }
    if (b < u.size()) lines.push_back(FromU32(u.substr(b)));
    return StringList(lines);
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" ||
      name == "isupper" || name == "islower") {
    if (auto st = CheckArgs(args, f, {}); !st.ok()) return st;
    std::vector<char32_t> cps = DecodeUtf8(s);
    if (cps.empty()) return Value::Bool(false);
    bool any_cased = false;
    for (char32_t c : cps) {
      bool ok = true;
      if (name == "isdigit") ok = u_isdigit(c);
      if (name == "isspace") ok = IsPySpace(c);
      if (name == "isalpha") ok = u_isalpha(c);
      if (name == "isalnum") ok = u_isalnum(c);
      if (name == "isupper") {
        ok = !u_islower(c);
        any_cased = any_cased || u_isupper(c);
      }
      if (name == "islower") {
        ok = !u_isupper(c);
        any_cased = any_cased || u_islower(c);
      }
      if (!ok) return Value::Bool(false);
    }
    if (name == "isupper" || name == "islower") return Value::Bool(any_cased);
    return Value::Bool(true);
  }
  return TypeError(absl::StrCat("unsupported string method '", name, "'"));
}

const std::set<std::string>& StringMethods() {
  static const std::set<std::string> k = {
      "strip",    "lstrip",  "rstrip",  "split",   "rsplit",  "startswith",
      "endswith", "replace", "upper",   "lower",   "title",   "capitalize",
      "find",     "rfind",   "count",   "index",   "join",    "splitlines",
      "isdigit",  "isspace", "isalpha", "isalnum", "isupper", "islower",
      "format",   "encode",  "center",  "zfill",   "ljust",   "rjust"};
  return k;
}

bool IsDictMethod(const std::string& n) {
  static const std::set<std::string> k = {"get",    "items", "keys",       "values", "pop",
                                          "update", "copy",  "setdefault", "clear",  "popitem"};
  return k.count(n) > 0;
}

bool IsListMethod(const std::string& n) {
  static const std::set<std::string> k = {"append",  "extend", "pop",   "insert", "remove", "sort",
                                          "reverse", "clear",  "index", "count",  "copy"};
  return k.count(n) > 0;
}

// A looked-up name as an Undefined's hint shows it: its start only (a template can make a key
// as long as any string, and a hint is built on every miss).
std::string Shown(const std::string& name) {
  constexpr size_t kShownBytes = 200;
  return name.substr(0, kShownBytes);
}

Value Unsafe(const std::string& type, const std::string& name) {
  return Value::Undefined(
      absl::StrCat("access to attribute '", name, "' of '", type, "' object is unsafe."));
}

Value DictItemsList(const Value& obj) {
  Value::List items;
  for (const auto& [k, v] : obj.dict()) {
    items.push_back(Value::MakeTuple({Value::String(k), v}));
  }
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> DictMethod(const Value& obj, const std::string& name, CallArgs& args) {
  const std::string f = "dict." + name;
  if (name == "get") {
    if (auto st = CheckArgs(args, f, {"key", "default"}); !st.ok()) return st;
    Value key = Arg(args, 0, "key", Value());
    Value dflt = Arg(args, 1, "default", Value::None());
    if (key.is_string()) {
      if (const Value* v = obj.Find(key.str())) return *v;
    }
    return dflt;
  }
  if (auto st = CheckArgs(args, f, {}); !st.ok()) return st;
  if (name == "items") return DictItemsList(obj);
  if (name == "copy") return Value::MakeDict(obj.dict());
  Value::List items;
  for (const auto& [k, v] : obj.dict()) {
    items.push_back(name == "keys" ? Value::String(k) : v);
  }
  return Value::MakeList(std::move(items));
}

}  // namespace

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kString:
      if (StringMethods().count(name)) {
        return Value::MakeFunction("str." + name, [obj, name](CallArgs& args) {
          return StringMethod(obj.str(), name, args);
        });
      }
      break;
    case Value::Kind::kDict:
      if (IsDictMethod(name)) {
        if (name == "get" || name == "items" || name == "keys" || name == "values" ||
            name == "copy") {
          return Value::MakeFunction(
              "dict." + name, [obj, name](CallArgs& args) { return DictMethod(obj, name, args); },
              obj);
        }
        return Unsafe("dict", name);
      }
      [[fallthrough]];
    case Value::Kind::kNamespace:
      if (const Value* v = obj.Find(name)) return *v;
      return Value::Undefined(
          absl::StrCat("'", obj.kind() == Value::Kind::kDict ? "dict object" : "namespace",
                       "' has no attribute '", Shown(name), "'"));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (IsListMethod(name)) {
        if (name == "index" || name == "count") {
          return Value::MakeFunction(
              name,
              [obj, name](CallArgs& args) -> absl::StatusOr<Value> {
                if (auto st = CheckArgs(args, name, {"value"}); !st.ok()) return st;
                Value x = Arg(args, 0, "value", Value());
                int64_t n = 0;
                for (size_t i = 0; i < obj.list().size(); ++i) {
                  if (!PyEquals(obj.list()[i], x)) continue;
                  if (name == "index") return Value::Integer(static_cast<int64_t>(i));
                  ++n;
                }
                if (name == "index") return TypeError("value is not in list");
                return Value::Integer(n);
              },
              obj);
        }
        return Unsafe(obj.TypeName(), name);
      }
      break;
    default:
      break;
  }
  return Value::Undefined(
      absl::StrCat("'", obj.TypeName(), " object' has no attribute '", Shown(name), "'"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (key.is_string()) {
        if (const Value* v = obj.Find(key.str())) return *v;
        if (obj.kind() == Value::Kind::kDict && IsDictMethod(key.str())) {
          return GetAttr(obj, key.str());
        }
        return Value::Undefined(
            absl::StrCat("'dict object' has no attribute '", Shown(key.str()), "'"));
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString:
      if (key.kind() == Value::Kind::kInt || key.is_bool()) {
        bool is_str = obj.is_string();
        if (is_str && !ChargeScan(obj.str().size())) return RenderError();
        std::vector<char32_t> cps;
        if (is_str) cps = DecodeUtf8(obj.str());
        Int n = is_str ? static_cast<Int>(cps.size()) : static_cast<Int>(obj.list().size());
        Int i = key.int_value();
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
          return Value::Undefined(absl::StrCat(obj.TypeName(), " object has no element ",
                                               IntToString(key.int_value())));
        }
        if (is_str) {
          std::string out;
          AppendUtf8(cps[static_cast<size_t>(i)], &out);
          return Value::String(out);
        }
        return obj.list()[static_cast<size_t>(i)];
      }
      if (key.is_string()) return GetAttr(obj, key.str());
      break;
    default:
      break;
  }
  return Value::Undefined(
      absl::StrCat("'", obj.TypeName(), " object' has no attribute '", ToPyStr(key), "'"));
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                            const Value& step_v) {
  if (obj.is_undefined()) return UndefinedError(obj);
  bool is_str = obj.is_string();
  if (!is_str && !obj.is_sequence()) {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  auto as_index = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<Int>> {
    if (v.is_undefined() || v.is_none()) return std::optional<Int>();
    if (v.kind() != Value::Kind::kInt && !v.is_bool()) {
      return TypeError(absl::StrCat("slice ", what, " indices must be integers or None"));
    }
    return std::optional<Int>(v.int_value());
  };
  auto start = as_index(start_v, "start");
  auto stop = as_index(stop_v, "stop");
  auto step_o = as_index(step_v, "step");
  if (!start.ok()) return start.status();
  if (!stop.ok()) return stop.status();
  if (!step_o.ok()) return step_o.status();
  Int step = step_o->value_or(1);
  if (step == 0) return TypeError("slice step cannot be zero");
  if (is_str && !ChargeScan(obj.str().size())) return RenderError();
  std::vector<char32_t> cps;
  if (is_str) cps = DecodeUtf8(obj.str());
  Int n = is_str ? static_cast<Int>(cps.size()) : static_cast<Int>(obj.list().size());
  auto adjust = [&](std::optional<Int> v, Int dflt) {
    if (!v) return dflt;
    Int x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  Int b = adjust(*start, step < 0 ? n - 1 : 0);
  Int e = adjust(*stop, step < 0 ? -1 : n);
  std::vector<char32_t> out_cps;
  Value::List out_items;
  for (Int i = b; step > 0 ? i < e : i > e; i += step) {
    if (is_str) {
      out_cps.push_back(cps[static_cast<size_t>(i)]);
    } else {
      out_items.push_back(obj.list()[static_cast<size_t>(i)]);
    }
  }
  if (is_str) return Value::String(EncodeUtf8(out_cps));
  return obj.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out_items))
                                           : Value::MakeList(std::move(out_items));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  // The items are copied (a string's are made): charged before they exist.
  auto charge = [](size_t items) { return ChargeBytes(items * sizeof(Value)); };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kIterator:
      if (!v.deferred_error().ok()) return v.deferred_error();
      [[fallthrough]];
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (!charge(v.list().size())) return RenderError();
      return v.list();
    case Value::Kind::kDict: {
      if (!charge(v.dict().size())) return RenderError();
      std::vector<Value> keys;
      for (const auto& [k, e] : v.dict()) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      if (!ChargeScan(v.str().size()) || !charge(CodePointLength(v.str()))) return RenderError();
      std::vector<Value> chars;
      for (char32_t c : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.push_back(Value::String(s));
      }
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      if (!ChargeScan(v.str().size())) return RenderError();
      return static_cast<int64_t>(CodePointLength(v.str()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& needle) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", needle.TypeName()));
      }
      if (!ChargeSearch(container.str().size(), needle.str().size())) return RenderError();
      return container.str().find(needle.str()) != std::string::npos;
    case Value::Kind::kIterator:
      if (!container.deferred_error().ok()) return container.deferred_error();
      [[fallthrough]];
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& e : container.list()) {
        if (PyEquals(e, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return needle.is_string() && container.Find(needle.str()) != nullptr;
    default:
      return TypeError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

}  // namespace ringserve::chat::jinja
