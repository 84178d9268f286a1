#pragma once
// kvsift-bench --json: the results as JSON, written atomically (checked before the run).

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
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

inline std::string json_text(const options& o, const workload& w, const std::string& info,
                             const std::vector<row>& rows,
                             const std::vector<quality_row>& quality) {
  std::ostringstream f;
  f << "{\n  \"source\": \"" << json_escape(w.source) << "\",\n  \"keys\": " << w.keys.rows()
    << ",\n  \"dim\": " << w.keys.cols() << ",\n  \"train_queries\": " << w.train.rows()
    << ",\n  \"eval_queries\": " << w.eval.rows() << ",\n  \"metric\": \"" << o.metric
    << "\",\n  \"info\": \"" << json_escape(info) << "\",\n  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << "    {\"index\": \"" << r.index << "\", \"query\": \"" << r.query << "\", \"param\": \""
      << r.param << "\", \"recall\": " << r.recall << ", \"scanned\": " << r.scanned
      << ", \"mean_us\": " << r.mean_us << ", \"p50_us\": " << r.p50_us
      << ", \"p99_us\": " << r.p99_us << ", \"size\": " << r.size
      << ", \"exact_size\": " << r.exact_size << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
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
