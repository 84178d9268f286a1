#pragma once
// kvsift-bench --values: attention quality of a static window plus retrieval from the middle of
// a causal context, against full attention.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvsift/attention/quality.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/options.hpp"

namespace kvsift_bench {

/// One attention-quality row: a retrieval method at one setting, averaged over the queries.
struct quality_row {
  std::string method, param;
  double retrieved = 0, attended = 0, recovery = 0, error = 0, scanned = 0;
};

/// Retrieval from the middle of a causal context: fills `ids` (valid ids only) and returns the
/// vectors scored. `seed` is the best raw score of the static window.
using retrieve_fn =
    std::function<std::size_t(std::span<const float> q, kvsift::id_range middle, float seed,
                              kvsift::search_workspace& ws, std::vector<kvsift::id_t>& ids)>;

/// Attention quality of window + retrieval against full causal attention, per method, over the
/// evaluation queries (query i sits at position eval_first + i and attends [0, position]).
/// Multithreaded over queries (o.build.threads); graph and flat searches are const.
template <class Flat, class Graph>
std::vector<quality_row> run_quality(const options& o, const workload& w, const Flat& flat,
                                     const Graph* g) {
  const kvsift::static_window window{};
  const std::size_t d = w.keys.cols();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const kvsift::kv_view<float> kv(w.keys.cview(), w.values.cview());
  const kvsift::attention_params params{.scale = scale};

  std::vector<std::pair<quality_row, retrieve_fn>> methods;
  auto topk_into = [](std::vector<kvsift::id_t>& ids, std::size_t k, auto&& search) {
    ids.assign(k, kvsift::invalid_id);
    std::vector<float> scores(k);
    const auto st = search(std::span(ids), std::span(scores));
    std::erase(ids, kvsift::invalid_id);
    return st.distance_computations;
  };
  methods.push_back({{"window", "-"}, [](auto, auto, float, auto&, auto& ids) {
                       ids.clear();
                       return std::size_t{0};
                     }});
  for (std::size_t k : o.attn_k) {
    methods.push_back({{"exact top-k", "k=" + std::to_string(k)},
                       [&, k](auto q, auto mid, float, auto& ws, auto& ids) {
                         return topk_into(ids, k, [&](auto out, auto sc) {
                           return flat.topk(q, k, ws, out, sc, mid);
                         });
                       }});
    if (g) {
      const std::size_t L = std::max(k, o.attn_L);
      methods.push_back({{"roargraph top-k", "k=" + std::to_string(k) + ",L=" + std::to_string(L)},
                         [&, k, L](auto q, auto mid, float, auto& ws, auto& ids) {
                           return topk_into(ids, k, [&](auto out, auto sc) {
                             return kvsift::beam_search(*g, q, {k, L}, ws, out, sc, mid);
                           });
                         }});
    }
  }
  for (double b : o.attn_beta) {
    // beta is given in logit units (the softmax weight ratio to the best is >= e^-beta);
    // the searches compare raw scores, hence / scale.
    const float raw = static_cast<float>(b) / scale;
    std::ostringstream name;
    name << "beta=" << b;
    methods.push_back(
        {{"exact dipr", name.str()}, [&, raw](auto q, auto mid, float seed, auto& ws, auto& ids) {
           kvsift::dipr_result res;
           flat.dipr(q, {.beta = raw, .seed_score = seed}, ws, res, mid);
           ids = res.ids;
           return res.stats.distance_computations;
         }});
    if (g) {
      methods.push_back({{"roargraph dipr", name.str() + ",l0=" + std::to_string(o.attn_l0)},
                         [&, raw](auto q, auto mid, float seed, auto& ws, auto& ids) {
                           kvsift::dipr_result res;
                           kvsift::dipr_search(*g, q,
                                               {.beta = raw, .l0 = o.attn_l0, .seed_score = seed},
                                               ws, res, mid);
                           ids = res.ids;
                           return res.stats.distance_computations;
                         }});
    }
  }

  const std::size_t m = w.eval.rows(), nm = methods.size();
  std::vector<quality_row> per(m * nm);  // [query][method]
  std::vector<kvsift::search_workspace> wss(o.build.threads ? o.build.threads
                                                            : kvsift::default_thread_count());
  kvsift::parallel_for(m, wss.size(), [&](std::size_t i, std::size_t t) {
    const auto q = w.eval.cview().row_span(i);
    const std::size_t context = w.eval_first + i + 1;
    const auto full = kvsift::dense_attention(q, 0, 0, context, kv, params);
    const auto win = kvsift::attended_tokens(context, {}, window);
    float seed = -std::numeric_limits<float>::infinity();
    for (auto id : win)
      seed = std::max(seed, kvsift::inner_product::score(q.data(), w.keys.row(id), d));
    const std::size_t mid_first = window.initial;
    const std::size_t mid_last = context > window.recent ? context - window.recent : 0;
    std::vector<kvsift::id_t> ids;
    for (std::size_t j = 0; j < nm; ++j) {
      auto& r = per[i * nm + j];
      ids.clear();
      std::size_t scanned = 0;
      if (mid_last > mid_first) {
        scanned = methods[j].second(q, kvsift::id_range{mid_first, mid_last}, seed, wss[t], ids);
      }
      const auto attended = kvsift::attended_tokens(context, ids, window);
      const auto approx = kvsift::sparse_attention(q, 0, attended, kv, params);
      const auto qual = kvsift::compare_states(full, approx);
      r.retrieved = static_cast<double>(ids.size());
      r.attended = static_cast<double>(attended.size());
      r.recovery = qual.recovery;
      r.error = qual.rel_l2_error;
      r.scanned = static_cast<double>(scanned) / static_cast<double>(context);
    }
  });
  std::vector<quality_row> out;
  for (std::size_t j = 0; j < nm; ++j) {
    quality_row r = methods[j].first;
    for (std::size_t i = 0; i < m; ++i) {
      const auto& x = per[i * nm + j];
      r.retrieved += x.retrieved / static_cast<double>(m);
      r.attended += x.attended / static_cast<double>(m);
      r.recovery += x.recovery / static_cast<double>(m);
      r.error += x.error / static_cast<double>(m);
      r.scanned += x.scanned / static_cast<double>(m);
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace kvsift_bench
