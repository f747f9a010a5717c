#include "launcher/plan/job_env.h"

#include <algorithm>  // find
#include <cctype>
#include <map>
#include <sstream>  // istringstream

#include "base/safe_files.h"  // ReadTrustedFile

namespace dslaunch::launcher {

const std::vector<std::string>& DefaultExportPrefixes() {
  static const std::vector<std::string> kPrefixes = {
      "NCCL_",       "GLOO_", "PYTHON", "UCX_", "OMP_",
      "CUDA",        "MV2_",  "MLFLOW", "HF_",  "TRANSFORMERS_",
      "ACCELERATE_", "TORCH", "WANDB_"};
  return kPrefixes;
}

const std::vector<std::string>& InterpreterVariables() {
  static const std::vector<std::string> kNames = {
      "PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
      "LD_LIBRARY_PATH"};
  return kNames;
}

std::vector<std::string> DeepSpeedEnvFiles(const std::string& home,
                                           const std::string& ds_env_file) {
  const std::string name = ds_env_file.empty() ? ".deepspeed_env" : ds_env_file;
  if (name.front() == '/') return {name};
  std::vector<std::string> files;
  if (!home.empty()) files.push_back(home + "/" + name);
  files.push_back("./" + name);
  return files;
}

static bool ValidKey(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0])))
    return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// Parses the value after '=' up to the end of the line.
static StatusOr<std::string> ParseValue(std::string_view s,
                                        const std::string& where) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\'' || c == '"') {
      const size_t end = s.find(c, i + 1);
      size_t j = i + 1;
      if (c == '"') {
        for (; j < s.size() && s[j] != '"'; ++j) {
          if (s[j] != '\\' || j + 1 >= s.size()) {
            out.push_back(s[j]);
            continue;
          }
          const char e = s[++j];
          out.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
        }
        if (j >= s.size()) return DataError(where + ": unterminated \" quote");
        i = j + 1;
      } else {
        if (end == std::string_view::npos) {
          return DataError(where + ": unterminated ' quote");
        }
        out.append(s.substr(i + 1, end - i - 1));
        i = end + 1;
      }
    } else if (c == ' ' || c == '\t') {
      const size_t rest = s.find_first_not_of(" \t", i);
      if (rest == std::string_view::npos || s[rest] == '#') break;
      return DataError(where + ": unquoted space in value (quote the value)");
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

StatusOr<EnvList> ParseEnvFile(std::string_view text, const std::string& path) {
  EnvList out;
  int line_no = 0;
  std::istringstream in{std::string(text)};
  std::string raw;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no);
    std::string_view line(raw);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    line.remove_prefix(first);
    if (line.substr(0, 7) == "export " || line.substr(0, 7) == "export\t") {
      const size_t name = line.find_first_not_of(" \t", 6);
      if (name == std::string_view::npos) {
        return DataError(where + ": 'export' without a variable");
      }
      line.remove_prefix(name);
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return DataError(where + ": expected KEY=VALUE, got '" +
                       std::string(line) + "'");
    }
    const std::string key(line.substr(0, eq));
    if (!ValidKey(key))
      return DataError(where + ": invalid variable name '" + key + "'");
    ASSIGN_OR_RETURN(std::string value, ParseValue(line.substr(eq + 1), where));
    out.emplace_back(key, std::move(value));
  }
  return out;
}

StatusOr<EnvList> LoadEnvFile(const std::string& path) {
  StatusOr<std::string> text =
      base::ReadTrustedFile(path, "env file", kMaxEnvFileBytes);
  if (text.status().code() == StatusCode::kNotFound)  // a bad input: 65
    return DataError(text.status().message());
  RETURN_IF_ERROR(text.status());
  return ParseEnvFile(*text, path);
}

static bool Exported(const std::string& key,
                     const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (key.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

StatusOr<EnvList> CollectJobEnv(const JobEnvSources& sources) {
  EnvList all;
  const auto& prefixes = sources.export_prefixes.empty()
                             ? DefaultExportPrefixes()
                             : sources.export_prefixes;
  for (const char* const* p = sources.environ; p && *p; ++p) {
    const std::string kv(*p);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string key = kv.substr(0, eq);
    if (Exported(key, prefixes) ||
        std::find(InterpreterVariables().begin(), InterpreterVariables().end(),
                  key) != InterpreterVariables().end())
      all.emplace_back(key, kv.substr(eq + 1));
  }
  for (const auto& path : sources.deepspeed_env_files) {
    StatusOr<std::string> text =
        base::ReadTrustedFile(path, "env file", kMaxEnvFileBytes);
    if (text.status().code() == StatusCode::kNotFound) continue;
    RETURN_IF_ERROR(text.status());
    ASSIGN_OR_RETURN(EnvList vars, ParseEnvFile(*text, path));
    all.insert(all.end(), vars.begin(), vars.end());
  }
  for (const auto& path : sources.env_files) {
    ASSIGN_OR_RETURN(EnvList vars, LoadEnvFile(path));
    all.insert(all.end(), vars.begin(), vars.end());
  }
  for (const auto& kv : sources.env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || !ValidKey(kv.substr(0, eq))) {
      return InvalidArgument("--env '" + kv + "': expected KEY=VALUE");
    }
    all.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  std::map<std::string, size_t> index;
  EnvList out;
  for (auto& [k, v] : all) {
    auto [it, fresh] = index.emplace(k, out.size());
    if (fresh)
      out.emplace_back(k, v);
    else
      out[it->second].second = v;
  }
  return out;
}

}  // namespace dslaunch::launcher
