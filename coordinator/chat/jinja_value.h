// The value model of the chat-template Jinja interpreter: Python-like values (None, bool,
// int, float, str, list, tuple, dict with insertion order, namespace, callables, undefined)
// with Python's printing rules (str/repr), JSON conversion (json.dumps as transformers'
// `tojson` filter calls it) and comparison semantics. Strings are UTF-8; operations that
// Python defines on code points (len, indexing, slicing) work on code points.
//
// Values share their string/list/dict storage on copy (like Python references), so copying a
// value is cheap whatever its size. The sandbox that transformers uses is immutable, so only
// namespaces are mutated (`{% set ns.x = ... %}`), and a namespace attribute never holds a
// namespace (the evaluator refuses it): values form no cycles and their nesting depth, known
// when they are made, stays bounded. Values made during a render are charged to its budget
// (jinja_budget.h). Not thread-safe to share one Value tree between concurrent renders while
// a namespace in it is being set; each render builds its own values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace ringserve::chat::jinja {

class Value;
using Int = __int128;  // Python ints are unbounded; 128 bits hold every JSON integer.

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(CallArgs& args)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kFunction,
    kIterator,  // a one-shot iterator (generator): always true, no len()
  };
  using List = std::vector<Value>;
  using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

  Value() = default;                         // undefined
  static Value Undefined(std::string hint);  // hint: "'x' is undefined" for error messages
  static Value None();
  static Value Bool(bool b);
  static Value Integer(Int i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeTuple(List items);
  static Value MakeDict(Dict items);
  static Value MakeNamespace(Dict items);
  static Value MakeFunction(std::string name, Function fn);
  // A method: `bound` is the object the function holds, for holds_namespace().
  static Value MakeFunction(std::string name, Function fn, const Value& bound);
  // What Jinja's lazy filters (map, select, unique, ...) return; `type_name` is Python's
  // ("generator", "list_reverseiterator").
  static Value MakeIterator(List items, std::string type_name);
  // A generator over a non-iterable: fails with `error` only when iterated (Jinja's filters
  // are lazy).
  static Value MakeFailingIterator(absl::Status error);
  // range(...): a list that prints as `repr` ("range(0, 3)") and is not JSON serializable.
  static Value MakeRange(List items, std::string repr);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || is_bool(); }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool bool_value() const { return b_; }
  Int int_value() const { return i_; }  // also for bool (0/1)
  double float_value() const { return f_; }
  double AsDouble() const;  // int/bool/float as double
  // String contents, the undefined hint, the function name, the range repr or the iterator
  // type name.
  const std::string& str() const;
  const List& list() const { return *list_; }  // list, tuple and iterator items
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }  // namespaces only
  const Function& function() const { return *fn_; }
  bool is_range() const { return kind_ == Kind::kList && s_ != nullptr; }
  // Error to raise when an iterator is consumed; ok for everything else.
  absl::Status deferred_error() const { return error_ ? *error_ : absl::OkStatus(); }
  const std::string& function_name() const { return str(); }
  // Levels of list/tuple/dict/namespace nesting when the value was made (1 for a scalar).
  int depth() const { return depth_; }
  // Whether the value is, contains or (a method) holds a namespace.
  bool holds_namespace() const { return holds_namespace_; }

  // Dict lookup; nullptr when absent.
  const Value* Find(const std::string& key) const;
  // Python truthiness (undefined is false).
  bool Truthy() const;
  // Python type name for error messages ("str", "NoneType", "dict", ...).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool holds_namespace_ = false;
  int depth_ = 1;
  Int i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
  std::shared_ptr<const absl::Status> error_;
};

// Python str(v) (what `{{ v }}` prints; undefined prints as "").
std::string ToPyStr(const Value& v);
// Python repr(v).
std::string ToPyRepr(const Value& v);
std::string PyReprString(const std::string& s);
std::string PyFloatRepr(double f);
std::string IntToString(Int i);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;             // < 0: None (single line with ", " and ": ")
  std::string item_separator;  // empty: Python's default for the indent setting
  std::string key_separator;
  bool has_separators = false;
  bool sort_keys = false;
};
// json.dumps(v, ...). Errors for undefined, functions ("Object of type X is not JSON
// serializable").
absl::StatusOr<std::string> JsonDumps(const Value& v, const JsonDumpOptions& options);

// Python ==.
bool PyEquals(const Value& a, const Value& b);
// Python <; error for unorderable types.
absl::StatusOr<bool> PyLess(const Value& a, const Value& b);

// UTF-8 <-> code points (invalid bytes map to U+FFFD).
std::vector<char32_t> DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::vector<char32_t>& cps);
using ::ringserve::AppendUtf8;
size_t CodePointLength(const std::string& s);
// Python str.isspace() for one code point.
bool IsPySpace(char32_t cp);

}  // namespace ringserve::chat::jinja
