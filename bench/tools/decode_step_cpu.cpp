// One decode step of one layer on the CPU, in C++: 32 query heads over 8 KV heads (GQA 4),
// d = 128, window attention (sinks + recent window) + top-100 RoarGraph search per query head +
// sparse attention over the retrieved ids + log-sum-exp merges. The same calls, in the same
// order, as the Python module's batched step (python/src/attention.cpp, search.cpp:
// dense_attention_heads x 2, merge_states, search_heads, sparse_attention_heads,
// merge_states), so bench/python/decode_step.py can time both on the same data and graphs and
// report what the Python layer costs.
//
//   kvsift-decode_step_cpu prepare DIR [tokens=8192]   synthetic OOD keys per KV head
//       (testing/ood_generator.hpp), values, queries; one RoarGraph per KV head. Writes
//       DIR/{K,V,q}.f32 (raw f32: K, V (tokens, 8, 128); q (32, 128)), DIR/g<h>.kvsg (the
//       save_graph format RoarGraphIndex.load reads) and DIR/meta.txt (tokens, sinks, recent
//       window, k, L).
//   kvsift-decode_step_cpu time DIR [reps=200] [repeats=5]   the best of `repeats` loops of
//       `reps` steps, per step in microseconds (wall and thread CPU time), as JSON on stdout;
//       DIR/out_cpp.f32 = the step's output o (32, 128).
#include <time.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <kvsift/attention/merge.hpp>
#include <kvsift/attention/sparse_attention.hpp>
#include <kvsift/core/detail/simd.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/index/graph_io.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/search/predicate.hpp>
#include <kvsift/testing/ood_generator.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace kvsift;
constexpr std::size_t H = 32, HKV = 8, D = 128, group = H / HKV;
constexpr std::size_t sink = 4, recent = 256, k = 100, L = 128;

using store_t = view_store<float>;
using graph_t = graph_index<store_t>;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<float> read_f32(const std::string& path, std::size_t count) {
  std::vector<float> v(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in) {
    std::fprintf(stderr, "cannot read %zu floats from %s\n", count, path.c_str());
    std::exit(1);
  }
  return v;
}

void write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(float)));
}

// KV head g's keys inside the interleaved (tokens, HKV, D) array.
store_t head_store(const std::vector<float>& K, std::size_t n, std::size_t g) {
  return store_t(matrix_view<const float>(K.data() + g * D, n, D, HKV * D));
}

int prepare(const std::string& dir, std::size_t n) {
  std::vector<float> K(n * HKV * D), V(n * HKV * D), q(H * D);
  std::vector<std::vector<float>> train(HKV);
  for (std::size_t g = 0; g < HKV; ++g) {
    // Each KV head its own distribution; its group's 4 decode queries come from the same one.
    const auto x = testing::make_ood(
        {.keys = n, .queries = n / 2 + group, .dim = D, .topics = 256, .seed = 100 + g});
    for (std::size_t t = 0; t < n; ++t) {
      std::copy_n(x.keys.data() + t * D, D, K.data() + (t * HKV + g) * D);
    }
    train[g].assign(x.queries.begin(), x.queries.begin() + static_cast<std::ptrdiff_t>(n / 2 * D));
    for (std::size_t j = 0; j < group; ++j) {
      std::copy_n(x.queries.data() + (n / 2 + j) * D, D, q.data() + (g * group + j) * D);
    }
  }
  std::mt19937_64 gen(7);
  std::normal_distribution<float> nd;
  for (auto& v : V) v = nd(gen);
  write_f32(dir + "/K.f32", K);
  write_f32(dir + "/V.f32", V);
  write_f32(dir + "/q.f32", q);
  for (std::size_t g = 0; g < HKV; ++g) {
    const matrix_view<const float> tq(train[g].data(), n / 2, D);
    const auto graph =
        roargraph_builder<>({.nq = 100, .M = 32, .L = 200}).build(head_store(K, n, g), tq);
    save_graph(graph, dir + "/g" + std::to_string(g) + ".kvsg");
  }
  // What the Python side must use to take the same step.
  std::ofstream(dir + "/meta.txt")
      << n << " " << sink << " " << recent << " " << k << " " << L << "\n";
  return 0;
}

int time_step(const std::string& dir, std::size_t reps, std::size_t repeats) {
  std::size_t n = 0;
  std::ifstream(dir + "/meta.txt") >> n;
  if (n < sink + recent + k) {
    std::fprintf(stderr, "%s/meta.txt: expected tokens >= %zu, got %zu\n", dir.c_str(),
                 sink + recent + k, n);
    return 1;
  }
  const auto K = read_f32(dir + "/K.f32", n * HKV * D);
  const auto V = read_f32(dir + "/V.f32", n * HKV * D);
  const auto q = read_f32(dir + "/q.f32", H * D);
  std::vector<graph_t> graphs;
  for (std::size_t g = 0; g < HKV; ++g) {
    graphs.push_back(load_graph(dir + "/g" + std::to_string(g) + ".kvsg", head_store(K, n, g)));
  }
  const kv_view<float> kv(matrix_view<const float>(K.data(), n, D, HKV * D),
                          matrix_view<const float>(V.data(), n, D, HKV * D), HKV, D);
  const matrix_view<const float> qm(q.data(), H, D);
  const id_range window_out{sink, n - recent};

  // State reused across steps, as an engine would keep it (and as the Python module's
  // per-thread search workspace is).
  search_workspace ws;
  partial_state st(D);
  std::vector<float> o(H * D), lse(H), o2(H * D), lse2(H);
  std::vector<id_t> ids(H * k), row;
  std::vector<float> scores(H * k);
  const beam_search_params bp{.k = k, .L = L};
  // The head dim as a run-time value, as the Python module has it (with the constant D, GCC 12
  // + LTO warns on the merge's scalar tail loop: -Waggressive-loop-optimizations, bogus).
  const std::size_t d = kv.head_dim();
  auto step = [&] {
    // dense_attention_heads(q, K, V, 0, sink)
    for (std::size_t h = 0; h < H; ++h) {
      dense_attention(qm.row_span(h), h / group, 0, sink, kv, {}, st);
      std::copy(st.o.begin(), st.o.end(), o.begin() + static_cast<std::ptrdiff_t>(h * D));
      lse[h] = st.lse;
    }
    // merge_states(o, lse, *dense_attention_heads(q, K, V, n - recent, n))
    for (std::size_t h = 0; h < H; ++h) {
      dense_attention(qm.row_span(h), h / group, n - recent, n, kv, {}, st);
      std::copy(st.o.begin(), st.o.end(), o2.begin() + static_cast<std::ptrdiff_t>(h * D));
      lse2[h] = st.lse;
    }
    for (std::size_t h = 0; h < H; ++h) {
      merge_into(std::span<float>(o.data() + h * d, d), lse[h],
                 {std::span<const float>(o2.data() + h * d, d), lse2[h]});
    }
    // search_heads(graphs, q, k, L=L, filter=IdRange(sink, n - recent))
    for (std::size_t h = 0; h < H; ++h) {
      beam_search(graphs[h / group], qm.row_span(h), bp, ws, std::span<id_t>(ids.data() + h * k, k),
                  std::span<float>(scores.data() + h * k, k), window_out);
    }
    // merge_states(o, lse, *sparse_attention_heads(q, K, V, r.ids)): padding skipped.
    for (std::size_t h = 0; h < H; ++h) {
      row.clear();
      for (std::size_t j = 0; j < k; ++j) {
        if (ids[h * k + j] != invalid_id) row.push_back(ids[h * k + j]);
      }
      sparse_attention(qm.row_span(h), h / group, row, kv, {}, st);
      merge_into(std::span<float>(o.data() + h * d, d), lse[h], {st.o, st.lse});
    }
  };
  step();
  // Wall and this thread's CPU time: on a shared machine the wall clock also counts other
  // processes' turns on the core, so decode_step.py compares CPU times (Python: thread_time).
  double best = 1e30, best_cpu = 1e30;
  for (std::size_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    for (std::size_t i = 0; i < reps; ++i) step();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / static_cast<double>(reps));
    best_cpu = std::min(best_cpu, (thread_cpu_seconds() - c0) / static_cast<double>(reps));
  }
  write_f32(dir + "/out_cpp.f32", o);
  std::printf("{\"step_us\": %.3f, \"step_cpu_us\": %.3f, \"simd_width\": %zu, \"tokens\": %zu}\n",
              best * 1e6, best_cpu * 1e6, detail::simd::width, n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 3 || (mode != "prepare" && mode != "time")) {
    std::fprintf(stderr, "usage: %s prepare DIR [tokens=8192] | time DIR [reps=200] [repeats=5]\n",
                 argv[0]);
    return 2;
  }
  try {
    if (mode == "prepare") return prepare(argv[2], argc > 3 ? std::strtoull(argv[3], 0, 10) : 8192);
    return time_step(argv[2], argc > 3 ? std::strtoull(argv[3], 0, 10) : 200,
                     argc > 4 ? std::strtoull(argv[4], 0, 10) : 5);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
