// kvsift-bench: measure an index/query combination on a Q/K dump (or a synthetic
// out-of-distribution workload) against the exact answer, with the flat scan measured in the
// same run as the baseline. See `kvsift-bench --help`. The parts live in kvsift_bench/, one
// concern per header: options, datasets, measure (oracle and timed rows), run (the sweeps),
// quality (--values), peers (hnswlib / faiss), report (tables), json_out, plan_mode (--plan).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/json_out.hpp"
#include "kvsift_bench/options.hpp"
#include "kvsift_bench/plan_mode.hpp"
#include "kvsift_bench/report.hpp"
#include "kvsift_bench/run.hpp"

int main(int argc, char** argv) {
  const kvsift_bench::options o = kvsift_bench::parse(argc, argv);
  std::atexit(kvsift_bench::json_output::remove_pending_tmp);
  try {
    // Opened first: an unwritable --json target fails before the run, not after it.
    std::optional<kvsift_bench::json_output> json;
    if (!o.json.empty()) json.emplace(o.json);
    if (!o.plan.empty()) return kvsift_bench::run_plan(o);
    const kvsift_bench::workload w = kvsift_bench::load(o);
    if (!o.save_data.empty()) {
      std::filesystem::create_directories(o.save_data);
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "keys.fbin", w.keys.cview());
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "train.fbin", w.train.cview());
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "eval.fbin", w.eval.cview());
    }
    if (o.uses("roargraph") && o.load_index.empty() && o.load_train_knn.empty() &&
        w.train.rows() == 0) {
      kvsift_bench::usage_error(
          "--index roargraph needs training queries: --train or --train-fraction");
    }
    // An --hdf5 file sets the metric; the peers are measured in inner-product space only.
    if ((o.uses("hnsw") || o.uses("ivf")) && w.metric != "ip") {
      kvsift_bench::usage_error("--index hnsw/ivf: only --metric ip is supported, got " + w.metric +
                                " (--hdf5 euclidean)");
    }
    std::printf(
        "kvsift-bench: %s\n  keys %zu x %zu (f32), training queries %zu, evaluation queries %zu, "
        "metric %s%s\n",
        w.source.c_str(), w.keys.rows(), w.keys.cols(), w.train.rows(), w.eval.rows(),
        w.metric.c_str(),
        o.filter_prefix ? (", filter id < " + std::to_string(*o.filter_prefix)).c_str() : "");
    std::ostringstream info;
    std::vector<kvsift_bench::row> rows;
    std::vector<kvsift_bench::quality_row> quality;
    std::map<std::string, kvsift_bench::build_record> builds;
    auto go = [&](auto metric) {
      using M = decltype(metric);
      if (o.filter_prefix) {
        rows =
            kvsift_bench::run<M>(o, w, kvsift::id_below{*o.filter_prefix}, info, quality, builds);
      } else {
        rows = kvsift_bench::run<M>(o, w, kvsift::no_filter{}, info, quality, builds);
      }
    };
    if (w.metric == "ip")
      go(kvsift::inner_product{});
    else
      go(kvsift::l2{});
    std::istringstream lines(info.str());
    for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
    std::printf(
        "  recall vs exact answer; scanned = keys scored / keys; latency on one thread\n\n");
    kvsift_bench::print_table(rows);
    if (!quality.empty()) kvsift_bench::print_quality(quality, w);
    if (json) json->commit(kvsift_bench::json_text(o, w, info.str(), rows, quality, builds));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsift-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
