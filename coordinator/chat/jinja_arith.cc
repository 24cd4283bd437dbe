// Arithmetic operators and range() with Python semantics (int, float, str/list repetition),
// bounded like Jinja's sandbox.
#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_builtins.h"
#include "coordinator/chat/jinja_internal.h"

namespace ringserve::chat::jinja {
namespace {

absl::Status Unsupported(const std::string& a, const std::string& op, const Value& x,
                         const Value& y) {
  (void)a;
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", x.TypeName(),
                                "' and '", y.TypeName(), "'"));
}

absl::StatusOr<Value> Repeat(const Value& seq, Int n) {
  const bool empty = seq.is_string() ? seq.str().empty() : seq.list().empty();
  if (n < 0 || empty) n = 0;  // `'' * 10**30` is '' (without looping 10**30 times)
  if (seq.is_string()) {
    if (static_cast<double>(seq.str().size()) * static_cast<double>(n) > kMaxStringBytes) {
      return TypeError("string repetition result too large");
    }
    const size_t total = seq.str().size() * static_cast<size_t>(n);
    if (total == 0) return Value::String("");
    std::string out;
    out.reserve(total);
    out = seq.str();
    while (out.size() * 2 <= total) out += out;
    out.append(out, 0, total - out.size());
    return Value::String(std::move(out));
  }
  if (static_cast<double>(seq.list().size()) * static_cast<double>(n) > kMaxRange) {
    return TypeError("list repetition result too large");
  }
  Value::List out;
  for (Int i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return seq.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out))
                                           : Value::MakeList(std::move(out));
}

// Python float // and % (Objects/floatobject.c float_divmod).
void FloatDivMod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

}  // namespace

absl::StatusOr<Value> Negate(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.float_value());
  if (v.is_number()) return Value::Integer(-v.int_value());
  return TypeError(absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
}

absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b) {
  if (!RenderOk()) return RenderError();  // loops over operators (the sum filter) stop
  if (op == "~") {
    std::string s = ToPyStr(a) + ToPyStr(b);
    if (s.size() > kMaxStringBytes) return TypeError("string too large");
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat);
  if (op == "+") {
    if (floats) return Value::Float(a.AsDouble() + b.AsDouble());
    if (nums) {
      Int r;
      if (__builtin_add_overflow(a.int_value(), b.int_value(), &r)) {
        return TypeError("integer overflow");
      }
      return Value::Integer(r);
    }
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > kMaxStringBytes) return TypeError("string too large");
      return Value::String(a.str() + b.str());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      if (a.list().size() + b.list().size() > kMaxListItems) {
        return TypeError("list concatenation result too large");
      }
      Value::List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return a.kind() == Value::Kind::kTuple ? Value::MakeTuple(std::move(out))
                                             : Value::MakeList(std::move(out));
    }
    if (a.is_string() || a.is_sequence()) {
      return TypeError(absl::StrCat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(),
                                    "\") to ", a.TypeName()));
    }
    return Unsupported("", "+", a, b);
  }
  if (op == "-") {
    if (floats) return Value::Float(a.AsDouble() - b.AsDouble());
    if (nums) {
      Int r;
      if (__builtin_sub_overflow(a.int_value(), b.int_value(), &r)) {
        return TypeError("integer overflow");
      }
      return Value::Integer(r);
    }
    return Unsupported("", "-", a, b);
  }
  if (op == "*") {
    if (floats) return Value::Float(a.AsDouble() * b.AsDouble());
    if (nums) {
      Int r;
      if (__builtin_mul_overflow(a.int_value(), b.int_value(), &r)) {
        return TypeError("integer overflow");
      }
      return Value::Integer(r);
    }
    bool a_seq = a.is_string() || a.is_sequence();
    bool b_seq = b.is_string() || b.is_sequence();
    if (a_seq && (b.kind() == Value::Kind::kInt || b.is_bool())) return Repeat(a, b.int_value());
    if (b_seq && (a.kind() == Value::Kind::kInt || a.is_bool())) return Repeat(b, a.int_value());
    return Unsupported("", "*", a, b);
  }
  if (op == "/") {
    if (!nums) return Unsupported("", "/", a, b);
    if (b.AsDouble() == 0) return TypeError("division by zero");
    return Value::Float(a.AsDouble() / b.AsDouble());
  }
  if (op == "//" || op == "%") {
    if (!nums) {
      if (op == "%" && a.is_string()) {
        return TypeError("unsupported construct: printf-style string formatting with '%'");
      }
      return Unsupported("", op, a, b);
    }
    if (floats) {
      if (b.AsDouble() == 0) return TypeError("float division by zero");
      double fd, m;
      FloatDivMod(a.AsDouble(), b.AsDouble(), &fd, &m);
      return Value::Float(op == "//" ? fd : m);
    }
    Int x = a.int_value(), y = b.int_value();
    if (y == 0) return TypeError("integer division or modulo by zero");
    Int q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      q -= 1;
      r += y;
    }
    return Value::Integer(op == "//" ? q : r);
  }
  if (op == "**") {
    if (!nums) return Unsupported("", "** or pow()", a, b);
    if (!floats && b.int_value() >= 0) {
      Int base = a.int_value(), e = b.int_value(), r = 1;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(r, base, &r)) return TypeError("integer overflow");
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) {
          return TypeError("integer overflow");
        }
      }
      return Value::Integer(r);
    }
    if (a.AsDouble() == 0 && b.AsDouble() < 0) {
      return TypeError("0.0 cannot be raised to a negative power");
    }
    return Value::Float(std::pow(a.AsDouble(), b.AsDouble()));
  }
  return TypeError("unknown operator " + op);
}

absl::StatusOr<Value> CallRange(CallArgs& args) {
  if (!args.keyword.empty()) return TypeError("range() takes no keyword arguments");
  std::vector<Int> n;
  for (const Value& v : args.positional) {
    if (v.kind() != Value::Kind::kInt && !v.is_bool()) {
      return TypeError(
          absl::StrCat("'", v.TypeName(), "' object cannot be interpreted as an integer"));
    }
    n.push_back(v.int_value());
  }
  Int start = 0, stop = 0, step = 1;
  if (n.size() == 1) {
    stop = n[0];
  } else if (n.size() == 2 || n.size() == 3) {
    start = n[0];
    stop = n[1];
    if (n.size() == 3) step = n[2];
  } else {
    return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", n.size()));
  }
  if (step == 0) return TypeError("range() arg 3 must not be zero");
  Value::List out;
  for (Int i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      return TypeError(
          absl::StrCat("Range too big. The sandbox blocks ranges larger than "
                       "MAX_RANGE (",
                       kMaxRange, ")."));
    }
    out.push_back(Value::Integer(i));
  }
  std::string repr = absl::StrCat("range(", IntToString(start), ", ", IntToString(stop),
                                  step != 1 ? ", " + IntToString(step) : "", ")");
  return Value::MakeRange(std::move(out), std::move(repr));
}

}  // namespace ringserve::chat::jinja
