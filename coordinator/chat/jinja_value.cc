#include "coordinator/chat/jinja_value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_budget.h"

namespace ringserve::chat::jinja {

namespace {

// Nesting depth and namespace flag of a container from its items; charges the render for the
// items and refuses nesting deeper than kMaxValueDepth.
template <typename Items, typename ValueOf>
void Account(const Items& items, ValueOf value_of, int* depth, bool* holds_namespace) {
  int deepest = 0;
  for (const auto& item : items) {
    const Value& v = value_of(item);
    deepest = std::max(deepest, v.depth());
    *holds_namespace = *holds_namespace || v.holds_namespace();
  }
  *depth = deepest + 1;
  ChargeBytes(items.size() * sizeof(typename Items::value_type));
  if (*depth > kMaxValueDepth) {
    FailRender(absl::InvalidArgumentError(
        absl::StrCat("value nested deeper than ", kMaxValueDepth, " levels")));
  }
}

const Value& Self(const Value& v) { return v; }
const Value& Second(const std::pair<std::string, Value>& kv) { return kv.second; }

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  // A hint names what was looked up, which a template can make as long as any string: only
  // its start is kept (it is for error messages).
  constexpr size_t kMaxHintBytes = 256;
  if (hint.size() > kMaxHintBytes) hint = hint.substr(0, kMaxHintBytes) + "...";
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Integer(Int i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  ChargeBytes(s.size());
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  Account(items, Self, &v.depth_, &v.holds_namespace_);
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
Value Value::MakeIterator(List items, std::string type_name) {
  Value v = MakeList(std::move(items));
  v.kind_ = Kind::kIterator;
  v.s_ = std::make_shared<const std::string>(std::move(type_name));
  return v;
}
Value Value::MakeFailingIterator(absl::Status error) {
  Value v = MakeIterator({}, "generator");
  v.error_ = std::make_shared<const absl::Status>(std::move(error));
  return v;
}
Value Value::MakeRange(List items, std::string repr) {
  Value v = MakeList(std::move(items));
  v.s_ = std::make_shared<const std::string>(std::move(repr));
  return v;
}
Value Value::MakeDict(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  Account(items, Second, &v.depth_, &v.holds_namespace_);
  size_t key_bytes = 0;  // the keys are copies too
  for (const auto& item : items) key_bytes += item.first.size();
  ChargeBytes(key_bytes);
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::MakeNamespace(Dict items) {
  Value v = MakeDict(std::move(items));
  v.kind_ = Kind::kNamespace;
  v.holds_namespace_ = true;
  return v;
}
Value Value::MakeFunction(std::string name, Function fn) {
  return MakeFunction(std::move(name), std::move(fn), None());
}
Value Value::MakeFunction(std::string name, Function fn, const Value& bound) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<Function>(std::move(fn));
  v.holds_namespace_ = bound.holds_namespace_;
  return v;
}

const std::string& Value::str() const {
  static const std::string* const kEmpty = new std::string();
  return s_ ? *s_ : *kEmpty;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return None();
    case T::boolean:
      return Bool(j.get<bool>());
    case T::number_integer:
      return Integer(j.get<int64_t>());
    case T::number_unsigned:
      return Integer(static_cast<Int>(j.get<uint64_t>()));
    case T::number_float:
      return Float(j.get<double>());
    case T::string:
      return String(j.get<std::string>());
    case T::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case T::object: {
      Dict items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, FromJson(e));
      return MakeDict(std::move(items));
    }
    default:  // binary, discarded
      return None();
  }
}

double Value::AsDouble() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }

const Value* Value::Find(const std::string& key) const {
  if (!dict_) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (SameKey(k, key)) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
    case Kind::kIterator:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_range() ? "range" : "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
    case Kind::kIterator:
      return str();
  }
  return "object";
}

// ---- Unicode helpers ----

std::vector<char32_t> DecodeUtf8(const std::string& s) {
  ChargeBytes(s.size() * sizeof(char32_t));
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string EncodeUtf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

size_t CodePointLength(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsPySpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

bool IsPyPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

void AppendHex(uint32_t v, int digits, std::string* out) {
  static const char* kHex = "0123456789abcdef";
  for (int d = digits - 1; d >= 0; --d) out->push_back(kHex[(v >> (4 * d)) & 0xF]);
}

}  // namespace

std::string PyReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : DecodeUtf8(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x7F && cp >= 0x20) {
      out.push_back(static_cast<char>(cp));
    } else if (IsPyPrintable(cp) && cp >= 0x80) {
      AppendUtf8(cp, &out);
    } else if (cp <= 0xFF) {
      out += "\\x";
      AppendHex(cp, 2, &out);
    } else if (cp <= 0xFFFF) {
      out += "\\u";
      AppendHex(cp, 4, &out);
    } else {
      out += "\\U";
      AppendHex(cp, 8, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string IntToString(Int i) {
  if (i == 0) return "0";
  bool neg = i < 0;
  unsigned __int128 u =
      neg ? -static_cast<unsigned __int128>(i) : static_cast<unsigned __int128>(i);
  std::string digits;
  while (u > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  if (neg) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

std::string PyFloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for -4 <= exponent < 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (static_cast<int>(digits.size()) <= exp + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    std::string e = std::to_string(exp < 0 ? -exp : exp);
    if (e.size() < 2) e = "0" + e;
    out += e;
  }
  return out;
}

namespace {

// Appends repr(v) to `out`; false (the render failed) once `out` would pass kMaxStringBytes or
// the render's budget is spent. Every node costs a step: a value that shares one list many
// times prints it many times.
bool AppendRepr(const Value& v, std::string* out) {
  if (!ChargeSteps(1)) return false;
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      *out += "Undefined";
      break;
    case Value::Kind::kNone:
      *out += "None";
      break;
    case Value::Kind::kBool:
      *out += v.bool_value() ? "True" : "False";
      break;
    case Value::Kind::kInt:
      *out += IntToString(v.int_value());
      break;
    case Value::Kind::kFloat:
      *out += PyFloatRepr(v.float_value());
      break;
    case Value::Kind::kString:
      if (!ChargeScan(v.str().size())) return false;
      *out += PyReprString(v.str());
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.is_range()) {
        *out += v.str();
        break;
      }
      bool tuple = v.kind() == Value::Kind::kTuple;
      *out += tuple ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += ", ";
        if (!AppendRepr(v.list()[i], out)) return false;
      }
      if (tuple && v.list().size() == 1) *out += ",";
      *out += tuple ? ")" : "]";
      break;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      *out += v.kind() == Value::Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.dict()) {
        if (!first) *out += ", ";
        first = false;
        *out += PyReprString(k) + ": ";
        if (!AppendRepr(e, out)) return false;
      }
      *out += v.kind() == Value::Kind::kNamespace ? "}>" : "}";
      break;
    }
    case Value::Kind::kFunction:
      *out += "<function " + v.function_name() + ">";
      break;
    case Value::Kind::kIterator:
      *out += "<" + v.TypeName() + " object>";
      break;
  }
  if (out->size() <= kMaxStringBytes) return true;
  return FailRender(absl::InvalidArgumentError("value too large to print (over 64 MiB)"));
}

}  // namespace

std::string ToPyStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.str();
    default:
      return ToPyRepr(v);
  }
}

std::string ToPyRepr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t cp : DecodeUtf8(s)) {
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
          if (cp > 0xFFFF) {
            char32_t v = cp - 0x10000;
            *out += "\\u";
            AppendHex(0xD800 + (v >> 10), 4, out);
            *out += "\\u";
            AppendHex(0xDC00 + (v & 0x3FF), 4, out);
          } else {
            *out += "\\u";
            AppendHex(cp, 4, out);
          }
        } else {
          AppendUtf8(cp, out);
        }
    }
  }
  out->push_back('"');
}

absl::Status JsonDump(const Value& v, const JsonDumpOptions& o, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: nesting too deep");
  if (out->size() > kMaxStringBytes) {
    return absl::InvalidArgumentError("tojson result too large (over 64 MiB)");
  }
  // As in AppendRepr: a list shared many times inside a value is dumped many times.
  if (!ChargeSteps(1)) return RenderError();
  const std::string item_sep = o.has_separators ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent) * d, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += IntToString(v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      double f = v.float_value();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PyFloatRepr(f);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      if (!ChargeScan(v.str().size())) return RenderError();
      JsonString(v.str(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.is_range()) {
        return absl::InvalidArgumentError("Object of type range is not JSON serializable");
      }
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        if (auto s = JsonDump(v.list()[i], o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, o.ensure_ascii, out);
        *out += key_sep;
        if (auto s = JsonDump(items[i]->second, o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> JsonDumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  if (auto s = JsonDump(v, options, 0, &out); !s.ok()) return s;
  if (out.size() > kMaxStringBytes) {
    return absl::InvalidArgumentError("tojson result too large (over 64 MiB)");
  }
  return out;
}

bool PyEquals(const Value& a, const Value& b) {
  using K = Value::Kind;
  // A render that has spent its budget fails; what this comparison answers no longer matters.
  if (!ChargeSteps(1)) return false;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.AsDouble() == b.AsDouble();
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      if (&a.str() == &b.str()) return true;
      return a.str().size() == b.str().size() && ChargeScan(a.str().size()) && a.str() == b.str();
    case K::kList:
    case K::kTuple:
      // Python compares items by identity first: a list shared inside two values is compared
      // once, not once per path to it.
      if (&a.list() == &b.list()) return true;
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!PyEquals(a.list()[i], b.list()[i])) return false;
      }
      return true;
    case K::kDict:
      if (&a.dict() == &b.dict()) return true;
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, e] : a.dict()) {
        const Value* o = b.Find(k);
        if (o == nullptr || !PyEquals(e, *o)) return false;
      }
      return true;
    case K::kNamespace:
      return &a.dict() == &b.dict();
    case K::kFunction:
      return &a.function() == &b.function();
    case K::kIterator:
      return &a.list() == &b.list();
    default:
      return false;
  }
}

absl::StatusOr<bool> PyLess(const Value& a, const Value& b) {
  if (!ChargeSteps(1)) return RenderError();
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.AsDouble() < b.AsDouble();
    }
    return a.int_value() < b.int_value();
  }
  if (a.is_string() && b.is_string()) {
    ChargeScan(std::min(a.str().size(), b.str().size()));
    return a.str() < b.str();  // UTF-8 order = code points
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (PyEquals(x[i], y[i])) continue;
      return PyLess(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace ringserve::chat::jinja
