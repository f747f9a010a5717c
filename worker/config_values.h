// Typed values read from a YAML/JSON config node, with errors that name the
// key and where it was written (file:line or the --set override). Used by
// train_config.cc.
#ifndef DSLAUNCH_WORKER_CONFIG_VALUES_H_
#define DSLAUNCH_WORKER_CONFIG_VALUES_H_

#include <yaml-cpp/yaml.h>  // YAML::Node

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace dslaunch::worker::config_values {

// One value being read: its node, its dotted key and where it was written.
struct Entry {
  const YAML::Node& node;
  const std::string& key;
  const std::string& where;
};

// How a node reads in an error message: 'text', a mapping, a list, null.
std::string Describe(const YAML::Node& node);

// "where: key: expected <want>, got <Describe(node)>".
Status TypeError(const Entry& e, const std::string& want);

// "where: key: <what>".
Status ValueError(const Entry& e, const std::string& what);

// A finite number.
Status ReadDouble(const Entry& e, double* out);

// Integers may be written as floats with no fraction ("5e8"), as JSON
// configs often do for bucket sizes.
Status ReadInt64(const Entry& e, int64_t lo, int64_t hi, int64_t* out);

// A batch size in [1, 2^30].
Status ReadBatchSize(const Entry& e, std::optional<int>* out);

Status ReadOptionalDouble(const Entry& e, std::optional<double>* out);

// true/false (and YAML's other spellings of them).
Status ReadBool(const Entry& e, bool* out);

// A scalar as written; null reads as "".
Status ReadString(const Entry& e, std::string* out);

// ASCII lower case.
std::string Lower(std::string s);

// ReadInt64 into a narrower integer (the range keeps it in bounds).

template <typename Int>
Status ReadInt(const Entry& e, int64_t lo, int64_t hi, Int* out) {
  int64_t v = 0;
  RETURN_IF_ERROR(ReadInt64(e, lo, hi, &v));
  *out = static_cast<Int>(v);
  return Status::Ok();
}

template <typename T>
struct Choice {
  const char* name;
  T value;
};

// Reads one of `choices` by name (ignoring case, as DeepSpeed does for
// optimizer types, when `any_case`).
template <typename T, size_t N>
Status ReadChoice(const Entry& e, const Choice<T> (&choices)[N], T* out,
                  bool any_case = false) {
  std::string name;
  RETURN_IF_ERROR(ReadString(e, &name));
  std::string names;
  for (const Choice<T>& choice : choices) {
    if (name == choice.name ||
        (any_case && Lower(name) == Lower(choice.name))) {
      *out = choice.value;
      return Status::Ok();
    }
    names += (names.empty() ? "" : ", ") + std::string(choice.name);
  }
  return ValueError(e, "'" + name + "' is not one of " + names);
}

}  // namespace dslaunch::worker::config_values

#endif  // DSLAUNCH_WORKER_CONFIG_VALUES_H_
