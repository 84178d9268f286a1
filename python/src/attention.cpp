// Attention of the Python module: sparse and dense partial attention (one head, or every
// query head of a decode step with the GQA mapping) and the log-sum-exp merges of partial
// states. K/V are borrowed in any layout with a contiguous innermost axis.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "common.hpp"
#include "kv_tensor.hpp"
#include "kvsift/attention/merge.hpp"
#include "kvsift/attention/partial_state.hpp"
#include "kvsift/attention/sparse_attention.hpp"

namespace kvsift_python {
namespace {

std::vector<float> bias_of(const py::object& bias) {
  if (bias.is_none()) return {};
  const auto b = vector_of(bias, "bias");
  return {b.s.begin(), b.s.end()};
}

template <class Fn>
std::pair<py::array_t<float>, float> with_kv(const py::handle& keys_h, const py::handle& values_h,
                                             Fn&& fn) {
  kvsift::partial_state st;
  visit_kv(keys_h, values_h, [&](const auto& kv) {
    py::gil_scoped_release release;
    fn(kv, st);
  });
  return {to_numpy(st.o), st.lse};
}

// ----------------------------------------------------------------------------- batched heads

/// Runs `one(q_row, q_head, kv_head, kv, state)` for every query head of q (H, d) over K/V with
/// kv_heads KV heads: the GQA mapping, query head h reads KV head h / (H / kv_heads). Heads run
/// on `threads` threads (0 = all) with the GIL released -> (o (H, d), lse (H,)).
template <class One>
std::pair<py::array_t<float>, py::array_t<float>> over_heads(const py::handle& q_h,
                                                             const py::handle& keys_h,
                                                             const py::handle& values_h,
                                                             std::size_t threads, One&& one) {
  const tensor qt = tensor_of(q_h, "q");
  const auto q = f32_matrix_of(qt, "q");
  return visit_kv(keys_h, values_h, [&](const auto& kv) {
    const std::size_t heads = q.rows();
    const std::size_t d = q.cols();
    const std::size_t hkv = kv.kv_heads();
    require<kvsift::dimension_mismatch>(d == kv.head_dim(), "q: expected head dim ", kv.head_dim(),
                                        " (that of keys), got ", d);
    require<kvsift::dimension_mismatch>(
        hkv > 0 && heads % hkv == 0, "q: expected a number of query heads that is a multiple of ",
        "the ", hkv, " KV heads (GQA groups), got ", heads);
    const std::size_t group = heads / hkv;
    py::array_t<float> o(
        std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(d)});
    py::array_t<float> lse(static_cast<py::ssize_t>(heads));
    float* op = o.mutable_data();
    float* lp = lse.mutable_data();
    {
      py::gil_scoped_release release;
      const std::size_t t =
          std::min(heads, threads == 0 ? kvsift::default_thread_count() : threads);
      std::vector<kvsift::partial_state> st(std::max<std::size_t>(t, 1));
      kvsift::parallel_for(heads, st.size(), [&](std::size_t h, std::size_t w) {
        one(q.row_span(h), h, h / group, kv, st[w]);
        std::copy(st[w].o.begin(), st[w].o.end(), op + h * d);
        lp[h] = st[w].lse;
      });
    }
    return std::pair(std::move(o), std::move(lse));
  });
}

/// Elementwise merge of H partial states: (o_a, lse_a) and (o_b, lse_b) of shapes (H, d), (H,).
std::pair<py::array_t<float>, py::array_t<float>> merge_states(const py::handle& o_a_h,
                                                               const py::handle& lse_a_h,
                                                               const py::handle& o_b_h,
                                                               const py::handle& lse_b_h) {
  const tensor ta = tensor_of(o_a_h, "o_a");
  const tensor tb = tensor_of(o_b_h, "o_b");
  const auto a = f32_matrix_of(ta, "o_a");
  const auto b = f32_matrix_of(tb, "o_b");
  const auto la = vector_of(lse_a_h, "lse_a");
  const auto lb = vector_of(lse_b_h, "lse_b");
  require<kvsift::dimension_mismatch>(a.rows() == b.rows() && a.cols() == b.cols(),
                                      "merge_states: expected o_a and o_b of one shape, got (",
                                      a.rows(), ", ", a.cols(), ") and (", b.rows(), ", ", b.cols(),
                                      ")");
  require<kvsift::dimension_mismatch>(
      la.s.size() == a.rows() && lb.s.size() == a.rows(), "merge_states: expected ", a.rows(),
      " lse values per side (one per state), got ", la.s.size(), " and ", lb.s.size());
  const std::size_t heads = a.rows();
  const std::size_t d = a.cols();
  py::array_t<float> o(
      std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(d)});
  py::array_t<float> lse(static_cast<py::ssize_t>(heads));
  float* op = o.mutable_data();
  float* lp = lse.mutable_data();
  for (std::size_t h = 0; h < heads; ++h) {
    std::copy_n(a.row(h), d, op + h * d);
    lp[h] = la.s[h];
    kvsift::merge_into(std::span<float>(op + h * d, d), lp[h], {b.row_span(h), lb.s[h]});
  }
  return {std::move(o), std::move(lse)};
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def(
      "sparse_attention",
      [](const py::handle& q, const py::handle& keys, const py::handle& values,
         const py::handle& tokens, std::size_t kv_head, float scale, const py::object& bias) {
        const auto qv = vector_of(q, "q");
        const std::span<const float> qs = qv.s;
        const auto ids = ids_of(tokens, "tokens");
        const auto b = bias_of(bias);
        return with_kv(keys, values, [&](const auto& kv, kvsift::partial_state& st) {
          kvsift::sparse_attention(qs, kv_head, ids, kv, {.scale = scale, .bias = b}, st);
        });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("tokens"), py::kw_only(),
      py::arg("kv_head") = 0, py::arg("scale") = 0.0f, py::arg("bias") = py::none(),
      "Attention of q over the listed tokens -> (o, lse) (natural-log LSE of the scaled "
      "logits; the empty set gives (0, -inf)). keys/values: (n, d) or (n, kv_heads, d), "
      "float32 or float16, borrowed. scale 0 = 1/sqrt(d). O(len(tokens) d).");
  m.def(
      "dense_attention",
      [](const py::handle& q, const py::handle& keys, const py::handle& values, std::size_t first,
         std::size_t last, std::size_t kv_head, float scale, const py::object& bias) {
        const auto qv = vector_of(q, "q");
        const std::span<const float> qs = qv.s;
        const auto b = bias_of(bias);
        return with_kv(keys, values, [&](const auto& kv, kvsift::partial_state& st) {
          kvsift::dense_attention(qs, kv_head, first, last, kv, {.scale = scale, .bias = b}, st);
        });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("first"), py::arg("last"),
      py::kw_only(), py::arg("kv_head") = 0, py::arg("scale") = 0.0f, py::arg("bias") = py::none(),
      "Attention of q over tokens [first, last) -> (o, lse); same path as sparse_attention.");
  m.def(
      "merge",
      [](const py::handle& o_a, float lse_a, const py::handle& o_b, float lse_b) {
        const auto a = vector_of(o_a, "o_a");
        const auto b = vector_of(o_b, "o_b");
        const auto st = kvsift::merge({a.s, lse_a}, {b.s, lse_b});
        return std::pair(to_numpy(st.o), st.lse);
      },
      py::arg("o_a"), py::arg("lse_a"), py::arg("o_b"), py::arg("lse_b"),
      "Log-sum-exp merge of two partial states over disjoint token sets -> (o, lse). O(d).");
  m.def(
      "dense_attention_heads",
      [](const py::handle& q, const py::handle& keys, const py::handle& values, std::size_t first,
         std::size_t last, float scale, std::size_t threads) {
        return over_heads(q, keys, values, threads,
                          [&](auto qs, std::size_t, std::size_t g, const auto& kv, auto& st) {
                            kvsift::dense_attention(qs, g, first, last, kv, {.scale = scale}, st);
                          });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("first"), py::arg("last"),
      py::kw_only(), py::arg("scale") = 0.0f, py::arg("threads") = 1,
      "Attention of every query head of q (H, d) float32 over tokens [first, last) of K/V "
      "(n, kv_heads, d) (or (n, d), one KV head) -> (o (H, d), lse (H,)). GQA: query head h "
      "reads KV head h // (H // kv_heads). threads: heads in parallel (0 = all; 1 is fastest "
      "for one decode step of short lists). O(H (last - first) d).");
  m.def(
      "sparse_attention_heads",
      [](const py::handle& q, const py::handle& keys, const py::handle& values,
         const py::handle& tokens, float scale, std::size_t threads) {
        const tensor qt = tensor_of(q, "q");
        const std::size_t heads = qt.ndim() >= 1 ? static_cast<std::size_t>(qt.shape[0]) : 0;
        const auto [ids, starts] = token_rows_of(tokens, heads, "tokens");
        return over_heads(q, keys, values, threads,
                          [&](auto qs, std::size_t h, std::size_t g, const auto& kv, auto& st) {
                            const std::span<const id_t> row(ids.data() + starts[h],
                                                            starts[h + 1] - starts[h]);
                            kvsift::sparse_attention(qs, g, row, kv, {.scale = scale}, st);
                          });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("tokens"), py::kw_only(),
      py::arg("scale") = 0.0f, py::arg("threads") = 1,
      "Attention of every query head of q (H, d) over its own token list: row h of tokens "
      "(H, k) integer (what search_heads returns; INVALID_ID entries are padding and skipped). "
      "GQA mapping and result as dense_attention_heads. O(H k d).");
  m.def("merge_states", &merge_states, py::arg("o_a"), py::arg("lse_a"), py::arg("o_b"),
        py::arg("lse_b"),
        "Merges H pairs of partial states: o_a, o_b (H, d) float32, lse_a, lse_b (H,) -> "
        "(o (H, d), lse (H,)). Each pair is merge(). O(H d).");
  m.def(
      "merge_n",
      [](const py::handle& os_h, const py::handle& lses_h) {
        const tensor os = tensor_of(os_h, "os");
        const auto o = f32_matrix_of(os, "os");
        const auto lses = vector_of(lses_h, "lses");
        require<kvsift::dimension_mismatch>(lses.s.size() == o.rows(), "merge_n: expected ",
                                            o.rows(), " lse values (one per state), got ",
                                            lses.s.size());
        std::vector<kvsift::partial_state_view> views;
        for (std::size_t i = 0; i < o.rows(); ++i) views.push_back({o.row_span(i), lses.s[i]});
        const auto st = kvsift::merge_n(views, o.cols());
        return std::pair(to_numpy(st.o), st.lse);
      },
      py::arg("os"), py::arg("lses"),
      "Merges s partial states (os: (s, d) float32, lses: (s,)) in one pass -> (o, lse).");
}

}  // namespace kvsift_python
