#pragma once
// kvsift-bench --json: the results as JSON, written atomically (checked before the run).

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>     // open
#include <sys/stat.h>  // stat
#include <unistd.h>    // write, fsync, close, unlink

#include "kvsift/kvsift.hpp"
#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/measure.hpp"
#include "kvsift_bench/options.hpp"
#include "kvsift_bench/quality.hpp"

namespace kvsift_bench {

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

/// The --json output file. Opened before the run (a typo'd directory or a read-only target
/// fails in a second, not after an hour of building), written whole at the end and checked for
/// write errors (a full disk is an error, not exit 0). A regular file (or a new path) is written
/// to a temporary in the same directory and renamed over the target, so a reader never sees a
/// half-written file and a failed run leaves the old one intact; a device or FIFO (/dev/stdout,
/// /dev/full) is written in place, since renaming over it would replace the device node.
class json_output {
 public:
  explicit json_output(std::string path) : path_(std::move(path)) {
    struct stat st {};
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) fail("is a directory");
    if (exists && !S_ISREG(st.st_mode)) {
      fd_ = ::open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      if (fd_ < 0) fail(std::strerror(errno));
      return;
    }
    const std::filesystem::path target(path_);
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
    tmp_ = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) {
      const std::string why = std::strerror(errno);
      tmp_.clear();
      fail("cannot create a temporary file in '" + dir.string() + "': " + why);
    }
    pending_tmp() = tmp_;
  }
  json_output(const json_output&) = delete;
  json_output& operator=(const json_output&) = delete;
  ~json_output() {
    if (fd_ >= 0) ::close(fd_);
    discard();
  }

  /// Writes `text`, flushes it to disk and renames the temporary over the target.
  /// @throw kvsift::io_error on any write, sync, close or rename failure (the target untouched).
  void commit(const std::string& text) {
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t r = ::write(fd_, text.data() + done, text.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail(std::string("write failed: ") + std::strerror(errno));
      done += static_cast<std::size_t>(r);
    }
    if (!tmp_.empty() && ::fsync(fd_) != 0) fail(std::string("fsync: ") + std::strerror(errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail(std::string("close: ") + std::strerror(errno));
    if (!tmp_.empty()) {
      if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        fail(std::string("rename from '") + tmp_ + "': " + std::strerror(errno));
      }
      tmp_.clear();
      pending_tmp().clear();
    }
  }

  /// The temporary of a run that never commits, removed at exit: usage_error() and the other
  /// std::exit paths skip destructors.
  static std::string& pending_tmp() {
    static std::string path;
    return path;
  }
  static void remove_pending_tmp() {
    if (!pending_tmp().empty()) ::unlink(pending_tmp().c_str());
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    discard();
    throw kvsift::io_error("--json '" + path_ + "': " + why);
  }
  void discard() {
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
    pending_tmp().clear();
  }

  std::string path_, tmp_;
  int fd_ = -1;
};

#ifndef KVSIFT_BENCH_VERSION
#define KVSIFT_BENCH_VERSION "unknown"
#endif
#ifndef KVSIFT_BENCH_GIT_COMMIT
#define KVSIFT_BENCH_GIT_COMMIT "unknown"
#endif

/// The "model name" of /proc/cpuinfo's first processor ("unknown" where there is none): timings
/// are only comparable on the same CPU.
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "unknown" : line.substr(first);
  }
  return "unknown";
}

/// A row's parameters as numbers: "L=100" -> "L": 100, "beta=0.5,l0=100" -> two entries, the
/// k of "top-10" -> "k": 10 ("param" keeps the label). A value that is not a number stays a
/// string.
inline std::string json_params(const row& r) {
  std::vector<std::pair<std::string, std::string>> kv;
  if (r.query.rfind("top-", 0) == 0) kv.emplace_back("k", r.query.substr(4));
  std::stringstream ss(r.param);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) kv.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  std::string out = "{";
  for (const auto& [key, value] : kv) {
    double x = 0;
    const char* last = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(value.data(), last, x);
    const bool number = !value.empty() && ec == std::errc{} && ptr == last && std::isfinite(x);
    out += (out.size() > 1 ? ", \"" : "\"") + json_escape(key) +
           "\": " + (number ? value : "\"" + json_escape(value) + "\"");
  }
  return out + "}";
}

inline std::string json_text(const options& o, const workload& w, const std::string& info,
                             const std::vector<row>& rows, const std::vector<quality_row>& quality,
                             const std::map<std::string, build_record>& builds) {
  const std::size_t threads = o.build.threads ? o.build.threads : kvsift::default_thread_count();
  auto bytes_or_null = [](const std::optional<std::size_t>& b) {
    return b ? std::to_string(*b) : std::string("null");
  };
  // Every number as the stream writes it (6 significant digits), so equal values read equal.
  auto number = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  std::ostringstream f;
  f << "{\n  \"source\": \"" << json_escape(w.source) << "\",\n  \"keys\": " << w.keys.rows()
    << ",\n  \"dim\": " << w.keys.cols() << ",\n  \"train_queries\": " << w.train.rows()
    << ",\n  \"eval_queries\": " << w.eval.rows() << ",\n  \"metric\": \"" << w.metric
    << "\",\n  \"kvsift_version\": \"" << json_escape(KVSIFT_BENCH_VERSION)
    << "\",\n  \"git_commit\": \"" << json_escape(KVSIFT_BENCH_GIT_COMMIT)
    << "\",\n  \"cpu_model\": \"" << json_escape(cpu_model()) << "\",\n  \"threads\": " << threads
    << ",\n  \"ground_truth\": \""
    << (w.given_exact ? json_escape(w.given_exact_source) : std::string("computed"))
    << "\",\n  \"indexes\": {";
  for (auto it = builds.begin(); it != builds.end(); ++it) {
    f << (it == builds.begin() ? "\n" : ",\n") << "    \"" << json_escape(it->first)
      << "\": {\"build_seconds\": " << it->second.seconds
      << ", \"index_bytes\": " << bytes_or_null(it->second.bytes);
    // --insert-fraction: the keys added one by one after the build, and their mean time.
    if (it->second.insert_us) {
      f << ", \"inserted\": " << it->second.inserted
        << ", \"insert_us_per_key\": " << number(*it->second.insert_us);
    }
    f << "}";
  }
  f << "\n  },\n  \"info\": \"" << json_escape(info) << "\",\n  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const auto b = builds.find(r.index);
    f << "    {\"index\": \"" << r.index << "\", \"query\": \"" << r.query << "\", \"param\": \""
      << r.param << "\", \"params\": " << json_params(r) << ", \"recall\": " << r.recall
      << ", \"scanned\": " << r.scanned << ", \"mean_us\": " << r.mean_us
      << ", \"p50_us\": " << r.p50_us << ", \"p99_us\": " << r.p99_us
      << ", \"batch_qps\": " << (r.batch_threads ? number(r.batch_qps) : "null")
      << ", \"batch_threads\": " << r.batch_threads
      << ", \"build_seconds\": " << (b != builds.end() ? number(b->second.seconds) : "null")
      << ", \"index_bytes\": " << (b != builds.end() ? bytes_or_null(b->second.bytes) : "null")
      << ", \"size\": " << r.size << ", \"exact_size\": " << r.exact_size << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"eval_first\": " << w.eval_first << ",\n  \"quality\": [\n";
  for (std::size_t i = 0; i < quality.size(); ++i) {
    const auto& r = quality[i];
    f << "    {\"method\": \"" << r.method << "\", \"param\": \"" << r.param
      << "\", \"retrieved\": " << r.retrieved << ", \"attended\": " << r.attended
      << ", \"recovery\": " << r.recovery << ", \"rel_l2_error\": " << r.error
      << ", \"scanned\": " << r.scanned << "}" << (i + 1 < quality.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  return f.str();
}

}  // namespace kvsift_bench
