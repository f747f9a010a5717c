#include "worker/config_values.h"

#include <algorithm>  // transform
#include <cctype>     // tolower
#include <cmath>      // fabs, floor, isfinite
#include <limits>     // numeric_limits

namespace dslaunch::worker::config_values {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

}  // namespace

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  return "null";
}

Status TypeError(const Entry& e, const std::string& want) {
  return DataError(e.where + ": " + e.key + ": expected " + want + ", got " +
                   Describe(e.node));
}

Status ValueError(const Entry& e, const std::string& what) {
  return DataError(e.where + ": " + e.key + ": " + what);
}

Status ReadDouble(const Entry& e, double* out) {
  double v = 0;
  if (!e.node.IsScalar() || !YAML::convert<double>::decode(e.node, v) ||
      !std::isfinite(v)) {
    return TypeError(e, "a number");
  }
  *out = v;
  return Status::Ok();
}

Status ReadInt64(const Entry& e, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  double d = 0;
  if (!e.node.IsScalar()) return TypeError(e, "an integer");
  if (!YAML::convert<int64_t>::decode(e.node, v)) {
    if (!YAML::convert<double>::decode(e.node, d) || d != std::floor(d) ||
        std::fabs(d) > 9e18) {
      return TypeError(e, "an integer");
    }
    v = static_cast<int64_t>(d);
  }
  if (v < lo || v > hi) {
    const std::string range =
        hi >= kMaxInt
            ? ">= " + std::to_string(lo)
            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return ValueError(
        e, std::to_string(v) + " is out of range (must be " + range + ")");
  }
  *out = v;
  return Status::Ok();
}

Status ReadBatchSize(const Entry& e, std::optional<int>* out) {
  int v = 0;
  RETURN_IF_ERROR(ReadInt(e, 1, 1 << 30, &v));
  *out = v;
  return Status::Ok();
}

Status ReadOptionalDouble(const Entry& e, std::optional<double>* out) {
  double v = 0;
  RETURN_IF_ERROR(ReadDouble(e, &v));
  *out = v;
  return Status::Ok();
}

Status ReadBool(const Entry& e, bool* out) {
  bool v = false;
  if (!e.node.IsScalar() || !YAML::convert<bool>::decode(e.node, v)) {
    return TypeError(e, "true or false");
  }
  *out = v;
  return Status::Ok();
}

Status ReadString(const Entry& e, std::string* out) {
  if (e.node.IsNull()) {
    out->clear();
    return Status::Ok();
  }
  if (!e.node.IsScalar()) return TypeError(e, "a string");
  *out = e.node.Scalar();
  return Status::Ok();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

}  // namespace dslaunch::worker::config_values
