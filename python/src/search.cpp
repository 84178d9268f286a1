// Searches of the Python module: top-k, beam, DIPR and block searches over the index objects,
// the filters they take, and their result types. Every search runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <span>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "indexes.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/search/gqa_search.hpp"

namespace kvsift_python {
namespace {

template <class Index>
dipr_output run_dipr(const Index& self, const py::handle& query_h, float beta, std::size_t l0,
                     std::size_t max_candidates, std::optional<float> seed_score,
                     const py::object& filter, const py::object& entries,
                     std::size_t degree_cap = 0, std::size_t max_hops = 0, bool walk_through = true,
                     std::size_t entry_prefix = 0) {
  const auto qv = vector_of(query_h, "query");
  const std::span<const float> q = qv.s;
  auto p = dipr_params_of(beta, l0, max_candidates, seed_score);
  p.degree_cap = bounded_count(degree_cap, "dipr: degree_cap");
  p.max_hops = bounded_count(max_hops, "dipr: max_hops");
  p.walk_through = walk_through;
  p.entry_prefix = bounded_count(entry_prefix, "dipr: entry_prefix");
  const filter_t f = filter_of(filter, self.size());
  const std::vector<id_t> extra =
      entries.is_none() ? std::vector<id_t>{} : entry_ids_of(entries, "entries");
  kvsift::dipr_result r;
  {
    py::gil_scoped_release release;
    std::visit(
        [&](const auto& index, const auto& pred) {
          if constexpr (std::is_same_v<Index, py_flat>) {
            require(extra.empty(), "FlatIndex.dipr: entries are meaningless for a flat scan");
            index.dipr(q, p, thread_workspace(), r, pred);
          } else {
            kvsift::dipr_search(index, q, p, thread_workspace(), r, pred,
                                std::span<const id_t>(extra));
          }
        },
        self.index(), f);
  }
  return to_python(r);
}

/// Runs `search(index, q, ws, result, pred)` with the GIL released and converts the result.
template <class Search>
block_output block_search(const py_block& self, const py::handle& query_h, const py::object& filter,
                          Search&& search) {
  const auto qv = vector_of(query_h, "query");
  const std::span<const float> q = qv.s;
  // block_index does not check queries for NaN/Inf (a NaN score just ranks last), so a NaN
  // query would silently return arbitrary blocks: rejected here. O(d).
  for (std::size_t i = 0; i < q.size(); ++i) {
    require<kvsift::non_finite_value>(
        std::isfinite(q[i]), "BlockIndex: expected a finite query, got ", q[i], " at position ", i);
  }
  const filter_t f = filter_of(filter, self.index().size());
  kvsift::block_result r;
  {
    py::gil_scoped_release release;
    std::visit([&](const auto& pred) { search(self.index(), q, thread_workspace(), r, pred); }, f);
  }
  block_output out;
  out.blocks = py::array_t<std::int64_t>(static_cast<py::ssize_t>(r.blocks.size()));
  std::copy(r.blocks.begin(), r.blocks.end(), out.blocks.mutable_data());
  out.scores = to_numpy(r.scores);
  out.distance_computations = static_cast<std::int64_t>(r.stats.distance_computations);
  return out;
}

}  // namespace

search_result flat_topk(const py_flat& self, const py::handle& queries, std::size_t k,
                        const py::object& filter, std::size_t threads) {
  const filter_t f = filter_of(filter, self.size());
  return std::visit(
      [&](const auto& index, const auto& pred) {
        return batched_topk(queries, k, threads,
                            [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
                              return index.topk(q, k, ws, ids, scores, pred);
                            });
      },
      self.index(), f);
}

search_result graph_search(const py_graph& self, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, const py::object& entries,
                           std::size_t threads, std::size_t degree_cap, std::size_t expand_limit,
                           bool walk_through, std::size_t entry_prefix) {
  const filter_t f = filter_of(filter, self.size());
  const std::vector<id_t> extra =
      entries.is_none() ? std::vector<id_t>{} : entry_ids_of(entries, "entries");
  const kvsift::beam_search_params p{
      .k = k,
      .L = bounded_count(L, "search: L"),
      .degree_cap = bounded_count(degree_cap, "search: degree_cap"),
      .expand_limit = bounded_count(expand_limit, "search: expand_limit"),
      .walk_through = walk_through,
      .entry_prefix = bounded_count(entry_prefix, "search: entry_prefix")};
  return std::visit(
      [&](const auto& index, const auto& pred) {
        return batched_topk(queries, k, threads,
                            [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
                              return kvsift::beam_search(index, q, p, ws, ids, scores, pred,
                                                         std::span<const id_t>(extra));
                            });
      },
      self.index(), f);
}

/// Top-k of query head h of `queries` (H, d) in `indexes[h / (H / len(indexes))]`: one call
/// for the query heads of a decode step over the per-KV-head indexes (GQA), heads in parallel.
search_result search_heads(const py::list& indexes, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, std::size_t threads,
                           std::size_t degree_cap, bool shared_walk, std::size_t expand_limit,
                           const py::object& entries, bool walk_through, std::size_t entry_prefix) {
  using one_index = std::variant<const py_graph*, const py_flat*, const py_insertable*>;
  std::vector<one_index> idx;
  for (const auto& h : indexes) {
    if (py::isinstance<py_graph>(h)) {
      idx.emplace_back(&h.cast<const py_graph&>());
    } else if (py::isinstance<py_flat>(h)) {
      idx.emplace_back(&h.cast<const py_flat&>());
    } else if (py::isinstance<py_insertable>(h)) {
      idx.emplace_back(&h.cast<const py_insertable&>());
    } else {
      throw py::type_error(
          "search_heads: expected a list of RoarGraphIndex, InsertableGraphIndex or FlatIndex, "
          "got " +
          std::string(py::str(py::type::of(h).attr("__name__"))));
    }
  }
  const tensor qt = tensor_of(queries, "queries");
  const std::int64_t heads = qt.ndim() == 2 ? qt.shape[0] : -1;
  require<kvsift::dimension_mismatch>(
      !idx.empty() && heads >= 0 && static_cast<std::size_t>(heads) % idx.size() == 0,
      "search_heads: expected (H, d) queries with H a multiple of the ", idx.size(),
      " indexes (one per KV head), got ", qt.ndim(), "-D queries of ", heads, " rows");
  const std::size_t group = static_cast<std::size_t>(heads) / idx.size();
  auto size_of = [](const auto& i) {
    return std::visit([](const auto* x) { return x->size(); }, i);
  };
  const filter_t f = filter_of(filter, size_of(idx.front()));
  // Extra entry points per query head (a warm start: the previous decode step's ids), checked
  // against each head's index here, before any search runs.
  std::vector<id_t> seed_ids;
  std::vector<std::size_t> seed_starts(static_cast<std::size_t>(heads) + 1, 0);
  if (!entries.is_none()) {
    std::tie(seed_ids, seed_starts) =
        token_rows_of(entries, static_cast<std::size_t>(heads), "search_heads: entries");
    for (std::size_t h = 0; h < static_cast<std::size_t>(heads); ++h) {
      const auto& i = idx[h / group];
      require(!std::holds_alternative<const py_flat*>(i),
              "search_heads: entries need graph indexes; a FlatIndex scans every key anyway");
      const std::size_t n = size_of(i);
      for (std::size_t j = seed_starts[h]; j < seed_starts[h + 1]; ++j) {
        require<kvsift::out_of_range>(seed_ids[j] < n, "search_heads: entries: expected ids < ", n,
                                      " (the size of query head ", h,
                                      "'s index) or INVALID_ID, got ", seed_ids[j]);
      }
    }
  }
  // Rows [first, last) of the entries, as one list (a group's rows are adjacent).
  auto seeds = [&](std::size_t first, std::size_t last) {
    return std::span<const id_t>(seed_ids.data() + seed_starts[first],
                                 seed_starts[last] - seed_starts[first]);
  };
  // degree_cap and expand_limit shape the graph walk only: a FlatIndex head scans every key.
  const kvsift::beam_search_params p{
      .k = k,
      .L = bounded_count(L, "search_heads: L"),
      .degree_cap = bounded_count(degree_cap, "search_heads: degree_cap"),
      .expand_limit = bounded_count(expand_limit, "search_heads: expand_limit"),
      .walk_through = walk_through,
      .entry_prefix = bounded_count(entry_prefix, "search_heads: entry_prefix")};
  if (shared_walk) {
    // One walk per GQA group (gqa_beam_search): a key row is read once for the group's heads.
    for (const auto& i : idx) {
      require(!std::holds_alternative<const py_flat*>(i),
              "search_heads: shared_walk needs graph indexes (RoarGraphIndex or "
              "InsertableGraphIndex); a FlatIndex scans every key anyway");
    }
    return std::visit(
        [&](const auto& pred) {
          return batched_groups(
              queries, k, threads, group,
              [&](std::size_t g, auto rows, auto& ws, auto ids, auto scores, auto counts) {
                // The group's entries: the union of its heads' rows (the walk's visited set
                // scores a repeated id once).
                auto walk = [&](const auto& gr) {
                  return kvsift::gqa_beam_search(gr, rows, p, ws, ids, scores, counts, pred,
                                                 seeds(g * group, (g + 1) * group));
                };
                return std::visit(
                    [&](const auto* index) -> kvsift::search_stats {
                      if constexpr (std::is_same_v<decltype(index), const py_insertable*>) {
                        return index->read(walk);
                      } else if constexpr (std::is_same_v<decltype(index), const py_graph*>) {
                        return std::visit(walk, index->index());
                      } else {
                        return kvsift::search_stats{};  // refused above
                      }
                    },
                    idx[g]);
              });
        },
        f);
  }
  return std::visit(
      [&](const auto& pred) {
        return batched_topk(
            queries, k, threads, [&](std::size_t h, auto q, auto& ws, auto ids, auto scores) {
              return std::visit(
                  [&](const auto* index) -> kvsift::search_stats {
                    if constexpr (std::is_same_v<decltype(index), const py_insertable*>) {
                      // Shared with inserts: the search holds the read side of its lock.
                      return index->read([&](const auto& g) {
                        return kvsift::beam_search(g, q, p, ws, ids, scores, pred, seeds(h, h + 1));
                      });
                    } else {
                      return std::visit(
                          [&](const auto& i) -> kvsift::search_stats {
                            if constexpr (std::is_same_v<decltype(index), const py_flat*>) {
                              return i.topk(q, k, ws, ids, scores, pred);
                            } else {
                              return kvsift::beam_search(i, q, p, ws, ids, scores, pred,
                                                         seeds(h, h + 1));
                            }
                          },
                          index->index());
                    }
                  },
                  idx[h / group]);
            });
      },
      f);
}

/// DIPR for every query head of a decode step, in one call (the per-head Python loop of a
/// DIPR decode step, done on `threads` threads with the GIL released). Results are padded to
/// the longest head's count: ids INVALID_ID and scores -inf past `counts[h]`, which is the
/// form `sparse_attention_heads` takes.
struct dipr_heads_output {
  py::array_t<std::int64_t> ids;                    ///< (H, width), width = max(1, max count)
  py::array_t<float> scores;                        ///< (H, width)
  py::array_t<std::int64_t> counts;                 ///< (H,)
  py::array_t<float> best_scores;                   ///< (H,)
  py::array_t<bool> capped;                         ///< (H,)
  py::array_t<std::int64_t> distance_computations;  ///< (H,)
};

dipr_heads_output dipr_heads(const py::list& indexes, const py::handle& queries, float beta,
                             std::size_t l0, std::size_t max_candidates,
                             const py::object& seed_scores, const py::object& filter,
                             const py::object& entries, std::size_t threads, std::size_t degree_cap,
                             bool walk_through, std::size_t entry_prefix) {
  std::vector<const py_graph*> idx;
  for (const auto& h : indexes) {
    if (!py::isinstance<py_graph>(h)) {
      throw py::type_error("dipr_heads: expected a list of RoarGraphIndex, got " +
                           std::string(py::str(py::type::of(h).attr("__name__"))));
    }
    idx.push_back(&h.cast<const py_graph&>());
  }
  const tensor qt = tensor_of(queries, "queries");
  require_dtype(qt, dtypes::f32, "queries");
  const std::int64_t rows = qt.ndim() == 2 ? qt.shape[0] : -1;
  require<kvsift::dimension_mismatch>(
      !idx.empty() && rows > 0 && static_cast<std::size_t>(rows) % idx.size() == 0,
      "dipr_heads: expected (H, d) queries with H a multiple of the ", idx.size(),
      " indexes (one per KV head), got ", qt.ndim(), "-D queries of ", rows, " rows");
  const kvsift::matrix_view<const float> q = matrix_of<float>(qt, "queries");
  const std::size_t heads = q.rows(), group = heads / idx.size();
  // Seeds: one per query head (each head's best window logit), or none.
  std::vector<float> seeds;
  if (!seed_scores.is_none()) {
    const auto sv = vector_of(seed_scores, "seed_scores");
    require<kvsift::dimension_mismatch>(sv.s.size() == heads, "dipr_heads: expected ", heads,
                                        " seed_scores (one per query head), got ", sv.s.size());
    seeds.assign(sv.s.begin(), sv.s.end());
  }
  kvsift::dipr_params base = dipr_params_of(beta, l0, max_candidates, std::nullopt);
  base.degree_cap = bounded_count(degree_cap, "dipr_heads: degree_cap");
  base.walk_through = walk_through;
  base.entry_prefix = bounded_count(entry_prefix, "dipr_heads: entry_prefix");
  const filter_t f = filter_of(filter, idx.front()->size());
  const std::vector<id_t> extra =
      entries.is_none() ? std::vector<id_t>{} : entry_ids_of(entries, "entries");
  std::vector<kvsift::dipr_result> res(heads);
  {
    py::gil_scoped_release release;
    const std::size_t t = std::min(heads, threads == 0 ? kvsift::default_thread_count() : threads);
    std::vector<kvsift::search_workspace> ws(std::max<std::size_t>(t, 1));
    std::visit(
        [&](const auto& pred) {
          kvsift::parallel_for(heads, ws.size(), [&](std::size_t h, std::size_t w) {
            kvsift::dipr_params p = base;
            if (!seeds.empty()) p.seed_score = seeds[h];
            std::visit(
                [&](const auto& index) {
                  kvsift::dipr_search(index, q.row_span(h), p, ws[w], res[h], pred,
                                      std::span<const id_t>(extra));
                },
                idx[h / group]->index());
          });
        },
        f);
  }
  std::size_t width = 1;
  for (const auto& r : res) width = std::max(width, r.ids.size());
  dipr_heads_output out;
  const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(heads),
                                       static_cast<py::ssize_t>(width)};
  out.ids = py::array_t<std::int64_t>(shape);
  out.scores = py::array_t<float>(shape);
  const auto hn = static_cast<py::ssize_t>(heads);
  out.counts = py::array_t<std::int64_t>(hn);
  out.best_scores = py::array_t<float>(hn);
  out.capped = py::array_t<bool>(hn);
  out.distance_computations = py::array_t<std::int64_t>(hn);
  std::int64_t* ids = out.ids.mutable_data();
  float* scores = out.scores.mutable_data();
  for (std::size_t h = 0; h < heads; ++h) {
    const auto& r = res[h];
    for (std::size_t j = 0; j < width; ++j) {
      const bool have = j < r.ids.size();
      ids[h * width + j] = have ? static_cast<std::int64_t>(r.ids[j])
                                : static_cast<std::int64_t>(kvsift::invalid_id);
      scores[h * width + j] = have ? r.scores[j] : -std::numeric_limits<float>::infinity();
    }
    out.counts.mutable_data()[h] = static_cast<std::int64_t>(r.ids.size());
    out.best_scores.mutable_data()[h] = r.best_score;
    out.capped.mutable_data()[h] = r.capped;
    out.distance_computations.mutable_data()[h] =
        static_cast<std::int64_t>(r.stats.distance_computations);
  }
  return out;
}

dipr_output flat_dipr(const py_flat& self, const py::handle& query, float beta, std::size_t l0,
                      std::size_t max_candidates, std::optional<float> seed_score,
                      const py::object& filter, const py::object& entries) {
  return run_dipr(self, query, beta, l0, max_candidates, seed_score, filter, entries);
}

dipr_output graph_dipr(const py_graph& self, const py::handle& query, float beta, std::size_t l0,
                       std::size_t max_candidates, std::optional<float> seed_score,
                       const py::object& filter, const py::object& entries, std::size_t degree_cap,
                       std::size_t max_hops, bool walk_through, std::size_t entry_prefix) {
  return run_dipr(self, query, beta, l0, max_candidates, seed_score, filter, entries, degree_cap,
                  max_hops, walk_through, entry_prefix);
}

search_result insertable_search(const py_insertable& self, const py::handle& queries, std::size_t k,
                                std::size_t L, std::size_t threads) {
  const kvsift::beam_search_params p{.k = k, .L = bounded_count(L, "search: L")};
  return batched_topk(
      queries, k, threads, [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
        return self.read(
            [&](const auto& g) { return kvsift::beam_search(g, q, p, ws, ids, scores); });
      });
}

block_output block_topk(const py_block& self, const py::handle& query, std::size_t k,
                        const py::object& filter) {
  return block_search(self, query, filter,
                      [k](const auto& idx, auto qs, auto& ws, auto& r, const auto& pred) {
                        idx.topk(qs, k, ws, r, pred);
                      });
}

block_output block_dipr(const py_block& self, const py::handle& query, float beta,
                        const py::object& filter) {
  return block_search(self, query, filter,
                      [beta](const auto& idx, auto qs, auto& ws, auto& r, const auto& pred) {
                        idx.dipr(qs, beta, ws, r, pred);
                      });
}

/// Token ids (int64, block order) of the given blocks that pass the filter.
py::array_t<std::int64_t> block_tokens(const py_block& self, const py::handle& blocks_h,
                                       const py::object& filter) {
  const tensor a = int_vector_of(blocks_h, "blocks", "block ids");
  std::vector<std::size_t> blocks(static_cast<std::size_t>(a.shape[0]));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::int64_t b = int_at(a, static_cast<std::int64_t>(i));
    // Negative values would wrap to huge ones; the C++ call checks the upper end.
    require<kvsift::out_of_range>(b >= 0, "blocks: expected block ids >= 0, got ", b,
                                  " at position ", i);
    blocks[i] = static_cast<std::size_t>(b);
  }
  const filter_t f = filter_of(filter, self.index().size());
  std::vector<id_t> ids;
  std::visit(
      [&](const auto& pred) {
        // tokens() does not validate its predicate (the searches do): a mask of another length
        // is an error here too, not a silent partial filter.
        kvsift::validate_predicate(pred, self.index().size());
        self.index().tokens(blocks, ids, pred);
      },
      f);
  return ids_to_numpy(ids);
}

void bind_search(py::module_& m) {
  py::class_<kvsift::id_below>(m, "IdBelow", "Filter: only ids < prefix_len (prefix reuse).")
      .def(py::init([](std::size_t n) { return kvsift::id_below{n}; }), py::arg("prefix_len"))
      .def_readonly("prefix_len", &kvsift::id_below::prefix_len);
  py::class_<kvsift::id_range>(m, "IdRange", "Filter: only ids in [first, last).")
      .def(py::init([](std::size_t a, std::size_t b) {
             return kvsift::id_range{a, b};
           }),
           py::arg("first"), py::arg("last"))
      .def_readonly("first", &kvsift::id_range::first)
      .def_readonly("last", &kvsift::id_range::last);

  py::class_<id_mask_filter>(m, "IdMask",
                             "Filter: only ids whose entry in mask is true. mask: 1-D bool (or "
                             "uint8, nonzero passes) array of one entry per key, borrowed (kept "
                             "alive, not copied; do not change it during a search). A mask of "
                             "another length than the index raises DimensionMismatch.")
      .def(py::init([](const py::handle& mask) { return id_mask_of(mask); }), py::arg("mask"))
      .def_property_readonly(
          "mask", [](const id_mask_filter& f) { return f.t.owner; },
          "The array (or DLPack export) read, not a copy.")
      .def("__len__", [](const id_mask_filter& f) { return f.bytes.size(); });
  py::class_<id_list_filter>(m, "IdList",
                             "Filter: only the listed ids. ids: 1-D integer array (copied; "
                             "duplicates allowed). Each search builds a bitmap over the index "
                             "(O(n / 8 + len(ids))); an id >= the index size raises OutOfRange.")
      .def(py::init(
               [](const py::handle& ids) { return id_list_filter{ids_of(ids, "IdList: ids")}; }),
           py::arg("ids"))
      .def_property_readonly(
          "ids", [](const id_list_filter& f) { return ids_to_numpy(f.ids); },
          "The ids as int64 (a copy).")
      .def("__len__", [](const id_list_filter& f) { return f.ids.size(); });

  py::class_<search_result>(m, "SearchResult",
                            "Top-k result: ids/scores (k,) or (m, k), best first; missing "
                            "results are INVALID_ID with the worst score.")
      .def_readonly("ids", &search_result::ids)
      .def_readonly("scores", &search_result::scores)
      .def_readonly("distance_computations", &search_result::distance_computations)
      .def_readonly("hops", &search_result::hops);
  py::class_<dipr_output>(m, "DiprResult", "Every key within beta of the best score, best first.")
      .def_readonly("ids", &dipr_output::ids)
      .def_readonly("scores", &dipr_output::scores)
      .def_readonly("best_score", &dipr_output::best_score)
      .def_readonly("capped", &dipr_output::capped)
      .def_readonly("distance_computations", &dipr_output::distance_computations)
      .def_readonly("hops", &dipr_output::hops);

  py::class_<block_output>(m, "BlockResult",
                           "Blocks of a block-index search, best first, with their scores.")
      .def_readonly("blocks", &block_output::blocks)
      .def_readonly("scores", &block_output::scores)
      .def_readonly("distance_computations", &block_output::distance_computations);

  py::class_<dipr_heads_output>(
      m, "DiprHeadsResult",
      "DIPR of every query head: ids/scores (H, width) best first, padded past counts[h] with "
      "INVALID_ID / -inf (the form sparse_attention_heads takes).")
      .def_readonly("ids", &dipr_heads_output::ids)
      .def_readonly("scores", &dipr_heads_output::scores)
      .def_readonly("counts", &dipr_heads_output::counts)
      .def_readonly("best_scores", &dipr_heads_output::best_scores)
      .def_readonly("capped", &dipr_heads_output::capped)
      .def_readonly("distance_computations", &dipr_heads_output::distance_computations);
  m.def("dipr_heads", &dipr_heads, py::arg("indexes"), py::arg("queries"), py::arg("beta"),
        py::kw_only(), py::arg("l0") = 64, py::arg("max_candidates") = 0,
        py::arg("seed_scores") = py::none(), py::arg("filter") = py::none(),
        py::arg("entries") = py::none(), py::arg("threads") = 1, py::arg("degree_cap") = 0,
        py::arg("walk_through") = true, py::arg("entry_prefix") = 0,
        "DIPR for every query head of a decode step: queries (H, d) float32, indexes one "
        "RoarGraphIndex per KV head (query head h uses indexes[h // (H // len(indexes))]). beta: "
        "keep every key whose score is within beta of the head's best, in raw q.k units; "
        "seed_scores: (H,) each head's best score known beforehand (e.g. over the static "
        "window), or None; l0 / max_candidates / entries / filter / degree_cap / walk_through / "
        "entry_prefix as in "
        "RoarGraphIndex.dipr. Heads run on `threads` threads with the GIL released. -> "
        "DiprHeadsResult.");
  m.def("search_heads", &search_heads, py::arg("indexes"), py::arg("queries"), py::arg("k"),
        py::kw_only(), py::arg("L") = 100, py::arg("filter") = py::none(), py::arg("threads") = 1,
        py::arg("degree_cap") = 0, py::arg("shared_walk") = false, py::arg("expand_limit") = 0,
        py::arg("entries") = py::none(), py::arg("walk_through") = true,
        py::arg("entry_prefix") = 0,
        "Top-k for every query head of a decode step: queries (H, d) float32, indexes one "
        "RoarGraphIndex, InsertableGraphIndex or FlatIndex per KV head (an insertable one is "
        "searched under its read lock, so inserts from another thread wait); query head h "
        "searches indexes[h // (H // "
        "len(indexes))] -> SearchResult with ids/scores (H, k). L: beam pool; degree_cap: "
        "expand only each node's first degree_cap neighbours, 0 = all (graph only); "
        "expand_limit: expand only the pool's best expand_limit entries, 0 = L (graph only). "
        "shared_walk: one walk per KV head for its group of query heads (gqa_beam_search: "
        "each head keeps its own pool, every key is read once for the group; graph indexes "
        "only); each head's distance_computations and hops are then its group's walk's. "
        "entries: (H, m) integer ids, extra entry points per query head, INVALID_ID entries "
        "skipped (graph only): a warm start from the previous decode step's ids (pair with "
        "expand_limit); a shared walk starts from the union of its group's rows. walk_through, "
        "entry_prefix: as in RoarGraphIndex.search (graph only).");
}

}  // namespace kvsift_python
