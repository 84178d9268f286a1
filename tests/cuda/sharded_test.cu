// The sharded decode calls (issue 20): one layer's KV heads cut into shards on devices 0 and 1
// (both device 0 with one GPU; the file says which), each shard holding its own graphs, pages,
// queries and stream. Every shard's outputs must equal, bit for bit, what decode_step /
// decode_search give for the same shard on one device; with a pool that retrieves every middle
// token the step must equal full attention (double precision); a bad shard must be refused
// before any shard is enqueued, its error naming the shard and keeping its type; the caller's
// current device must be the same afterwards.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kvsift/cuda/decode_search_sharded.cuh>
#include <kvsift/cuda/decode_step_sharded.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
namespace kc = kvsift::cuda;

constexpr int width = 12, page = 16;

/// Host data of one layer: per KV head a graph (a ring i -> i + 1 plus random edges, so every
/// token is reachable), its keys and values, and the queries of its GQA group.
struct layer {
  std::vector<int> sizes;
  int group = 0, d = 0;
  std::vector<std::vector<id_t>> adj;    // [g][n_g * width]
  std::vector<id_t> entry;               // [g]
  std::vector<std::vector<float>> k, v;  // [g][n_g * d]
  std::vector<float> q;                  // [heads * group][d]
};

layer make_layer(const std::vector<int>& sizes, int group, int d, int sink) {
  layer l;
  l.sizes = sizes;
  l.group = group;
  l.d = d;
  for (const int n : sizes) {
    std::vector<id_t> adj(static_cast<std::size_t>(n) * width, kvsift::invalid_id);
    for (int i = 0; i < n; ++i)
      fill_ring_row(adj.data() + static_cast<std::size_t>(i) * width, i, n, width);
    l.adj.push_back(std::move(adj));
    l.entry.push_back(static_cast<id_t>(std::min(n - 1, sink + 1)));
    std::vector<float> k(static_cast<std::size_t>(n) * d), v(k.size());
    for (auto& x : k) x = uniform(-1.0f, 1.0f);
    for (auto& x : v) x = uniform(-1.0f, 1.0f);
    l.k.push_back(std::move(k));
    l.v.push_back(std::move(v));
  }
  l.q.resize(sizes.size() * static_cast<std::size_t>(group) * d);
  for (auto& x : l.q) x = uniform(-2.0f, 2.0f);
  return l;
}

/// KV heads [g0, g1) of a layer on one device: the shard's graphs (local ids 0..), its own page
/// pool and table, its queries, outputs, workspace and a stream of that device.
struct shard {
  int device = 0, heads = 0;
  device_buffer<id_t> adj, ent, ids, carry;
  device_buffer<std::int64_t> off;
  device_buffer<float> k, v, dense, q, o, lse, scores;
  device_buffer<std::int32_t> table, qgraph;
  device_buffer<std::uint32_t> status, counts;
  device_buffer<char> ws;
  std::size_t ws_bytes = 0;
  cudaStream_t stream = nullptr;
  kc::graph_set_ref set{};
  kc::paged_kv_ref<float> kv{};
  // Routing sets (add_routes): `rows` random vectors per graph, each with a list of random
  // tokens of its graph.
  device_buffer<float> rvec;
  device_buffer<id_t> rlists;
  device_buffer<std::int64_t> roff;
  std::optional<kc::decode_step_routes<float>> routes;

  shard(const layer& l, int g0, int g1, int dev, const kc::decode_step_params& p) : device(dev) {
    const kvsift::cuda::detail::device_guard on(device);
    const int G = g1 - g0, d = l.d;
    heads = G * l.group;
    int max_n = 0;
    for (int g = g0; g < g1; ++g) max_n = std::max(max_n, l.sizes[g]);
    const int max_pages = (max_n + page - 1) / page;
    std::vector<std::int64_t> offsets{0};
    std::vector<id_t> a, e;
    std::vector<float> kp, vp, kd;
    std::vector<std::int32_t> t(static_cast<std::size_t>(G) * max_pages, -1);
    int pages = 0;
    for (int g = g0; g < g1; ++g) {
      const int n = l.sizes[g];
      offsets.push_back(offsets.back() + n);
      a.insert(a.end(), l.adj[g].begin(), l.adj[g].end());
      e.push_back(l.entry[g]);
      kd.insert(kd.end(), l.k[g].begin(), l.k[g].end());
      for (int pg = 0; pg < (n + page - 1) / page; ++pg) {
        t[static_cast<std::size_t>(g - g0) * max_pages + pg] = pages++;
        for (int r = 0; r < page; ++r) {
          const int tok = pg * page + r;
          for (int j = 0; j < d; ++j) {
            const std::size_t at = static_cast<std::size_t>(tok) * d + j;
            kp.push_back(tok < n ? l.k[g][at] : 0.0f);
            vp.push_back(tok < n ? l.v[g][at] : 0.0f);
          }
        }
      }
    }
    adj = device_buffer<id_t>(a);
    ent = device_buffer<id_t>(e);
    off = device_buffer<std::int64_t>(offsets);
    k = device_buffer<float>(kp);
    v = device_buffer<float>(vp);
    dense = device_buffer<float>(kd);
    table = device_buffer<std::int32_t>(t);
    q = device_buffer<float>(
        std::vector<float>(l.q.begin() + static_cast<std::ptrdiff_t>(g0) * l.group * d,
                           l.q.begin() + static_cast<std::ptrdiff_t>(g1) * l.group * d));
    std::vector<std::int32_t> qg(static_cast<std::size_t>(heads));
    for (int h = 0; h < heads; ++h) qg[static_cast<std::size_t>(h)] = h / l.group;
    qgraph = device_buffer<std::int32_t>(qg);
    // Outputs start as NaN bytes, so an output a call did not write shows.
    o = filled<float>(static_cast<std::size_t>(heads) * d);
    lse = filled<float>(static_cast<std::size_t>(heads));
    const int cap = kc::decode_search_capacity(p.search);
    ids = filled<id_t>(static_cast<std::size_t>(heads) * cap);
    carry = filled<id_t>(static_cast<std::size_t>(heads) * cap);  // 0xFF: no seeds yet
    scores = filled<float>(static_cast<std::size_t>(heads) * cap);
    counts = filled<std::uint32_t>(static_cast<std::size_t>(heads));
    status = device_buffer<std::uint32_t>(std::vector<std::uint32_t>{0});
    set = {adj.get(), off.get(), ent.get(), G, width, 1, max_n};
    kv = {k.get(), v.get(), pages, page, d, table.get(), G, max_pages};
    ws_bytes = std::max(kc::decode_step_workspace_size(set, heads, d, p),
                        kc::decode_search_workspace_size(set, heads, p.search));
    ws = device_buffer<char>(ws_bytes);
    KVSIFT_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  shard(const shard&) = delete;
  shard& operator=(const shard&) = delete;
  ~shard() {
    const kvsift::cuda::detail::quiet_device_guard on(device);
    cudaStreamDestroy(stream);
  }

  template <class T>
  static device_buffer<T> filled(std::size_t n) {
    device_buffer<T> b(n);
    KVSIFT_CUDA_CHECK(cudaMemset(b.get(), 0xFF, n * sizeof(T)));
    return b;
  }

  [[nodiscard]] kc::decode_step_shard<float> step_args() const {
    return {device,   set,      kv,     q.get(),      heads,       o.get(), lse.get(),
            ws.get(), ws_bytes, stream, status.get(), carry.get(), routes};
  }

  /// Gives the shard routing sets of `rows` rows per graph, lists of `list_len` tokens, and
  /// the workspace decode_step with them needs.
  void add_routes(const layer& l, int rows, int list_len, const kc::route_params& rp,
                  const kc::decode_step_params& p) {
    const kvsift::cuda::detail::device_guard on(device);
    const int G = set.num_graphs, d = l.d;
    std::vector<float> vecs(static_cast<std::size_t>(G) * rows * d);
    for (auto& x : vecs) x = uniform(-1.0f, 1.0f);
    std::vector<id_t> lists;
    std::vector<std::int64_t> offsets{0};
    const std::vector<std::int64_t> graph_off = off.download();
    for (int g = 0; g < G; ++g) {
      offsets.push_back(offsets.back() + rows);
      const int n = static_cast<int>(graph_off[static_cast<std::size_t>(g) + 1] -
                                     graph_off[static_cast<std::size_t>(g)]);
      for (int i = 0; i < rows * list_len; ++i)
        lists.push_back(static_cast<id_t>(uniform_int(0, n - 1)));
    }
    rvec = device_buffer<float>(vecs);
    rlists = device_buffer<id_t>(lists);
    roff = device_buffer<std::int64_t>(offsets);
    routes = kc::decode_step_routes<float>{
        {rvec.get(), d, d, rlists.get(), list_len, roff.get(), G, rows}, rp};
    ws_bytes = kc::decode_step_workspace_size(set, heads, d, p, *routes);
    ws = device_buffer<char>(ws_bytes);
  }

  [[nodiscard]] kc::decode_queries queries() const {
    kc::decode_queries qs;
    qs.q = q.get();
    qs.ld = kv.head_dim;
    qs.graph = qgraph.get();
    return qs;
  }

  [[nodiscard]] kc::decode_search_outputs search_outputs() const {
    return {ids.get(), scores.get(), counts.get(), nullptr, nullptr, status.get()};
  }
};

using shards_t = std::vector<std::unique_ptr<shard>>;

/// Cuts `l` at `cuts` (KV-head boundaries, from 0 to the head count) onto `devices`.
shards_t cut(const layer& l, const std::vector<int>& cuts, const std::vector<int>& devices,
             const kc::decode_step_params& p) {
  shards_t s;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    s.push_back(std::make_unique<shard>(l, cuts[i], cuts[i + 1], devices[i], p));
  }
  return s;
}

int second_device() {
  int devices = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int second = devices >= 2 ? 1 : 0;
  std::printf("  shards on devices {0, %d}%s\n", second,
              devices >= 2 ? "" : " (one device: both shards share it)");
  return second;
}

void sync_all() {
  int devices = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  for (int dev = 0; dev < devices; ++dev) {
    const kvsift::cuda::detail::device_guard on(dev);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void run_steps(const shards_t& s, int d, const kc::decode_step_params& p) {
  std::vector<kc::decode_step_shard<float>> args;
  for (const auto& x : s) args.push_back(x->step_args());
  kc::decode_step_sharded<float>(args, d, p);
}

/// Full attention in double of every query head of shard [g0, g1) of `l`: (o, lse) appended.
void full_attention(const layer& l, int g0, int g1, std::vector<double>& o,
                    std::vector<double>& lse) {
  const int d = l.d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int g = g0; g < g1; ++g) {
    const int n = l.sizes[g];
    for (int m = 0; m < l.group; ++m) {
      const float* q = &l.q[(static_cast<std::size_t>(g) * l.group + m) * d];
      const auto [o_m, lse_m] = full_attention_one(q, l.k[g].data(), l.v[g].data(), n, d, scale);
      o.insert(o.end(), o_m.begin(), o_m.end());
      lse.push_back(lse_m);
    }
  }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("decode_step_sharded_equals_full_attention_when_retrieval_is_whole", "[cuda][sharded]") {
  const int second = second_device();
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 1000;
  p.search.L = 1000;
  // Head 3 is all window (retrieval empty); three shards, two of them on device 0.
  const layer l = make_layer({700, 300, 900, 30, 1000, 500}, 4, 64, p.sink);
  const std::vector<int> cuts{0, 2, 5, 6};
  const shards_t s = cut(l, cuts, {0, second, 0}, p);
  run_steps(s, l.d, p);
  sync_all();
  for (std::size_t i = 0; i < s.size(); ++i) {
    INFO("shard " << i);
    std::vector<double> want_o, want_lse;
    full_attention(l, cuts[i], cuts[i + 1], want_o, want_lse);
    const std::vector<float> o = s[i]->o.download(), lse = s[i]->lse.download();
    REQUIRE(o.size() == want_o.size());
    int bad = 0;
    for (std::size_t j = 0; j < o.size(); ++j) bad += !(std::fabs(o[j] - want_o[j]) <= 2e-5);
    for (std::size_t j = 0; j < lse.size(); ++j) bad += !(std::fabs(lse[j] - want_lse[j]) <= 2e-5);
    CHECK(bad == 0);
    CHECK(s[i]->status.download()[0] == 0u);
  }
  int current = -1;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&current));
  CHECK(current == 0);
}

TEST_CASE("decode_step_sharded_equals_decode_step_per_shard", "[cuda][sharded]") {
  const int second = second_device();
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 16;  // a real retrieval: the pool holds a few percent of the middle tokens
  p.search.L = 32;
  const layer l = make_layer({1500, 700, 2000, 1200, 900}, 4, 128, p.sink);
  const std::vector<int> cuts{0, 2, 4, 5};
  const shards_t s = cut(l, cuts, {0, second, second}, p);
  const shards_t ref = cut(l, cuts, {0, 0, 0}, p);  // each shard again, on device 0
  // Two steps: the second starts from the carry the first left (the warm start).
  for (int step = 0; step < 2; ++step) {
    // Called while the second device is current: it must be current again afterwards.
    KVSIFT_CUDA_CHECK(cudaSetDevice(second));
    run_steps(s, l.d, p);
    int current = -1;
    KVSIFT_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == second);
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
    for (const auto& r : ref) {
      kc::decode_step(r->set, r->kv, r->q.get(), r->heads, l.d, r->o.get(), r->lse.get(),
                      r->ws.get(), r->ws_bytes, nullptr, p, r->status.get(), r->carry.get());
    }
    sync_all();
    for (std::size_t i = 0; i < s.size(); ++i) {
      INFO("step " << step << ", shard " << i << " on device " << s[i]->device);
      CHECK(same_bits(s[i]->o.download(), ref[i]->o.download()));
      CHECK(same_bits(s[i]->lse.download(), ref[i]->lse.download()));
      CHECK(same_bits(s[i]->carry.download(), ref[i]->carry.download()));
      CHECK(s[i]->status.download()[0] == ref[i]->status.download()[0]);
    }
  }
  // The outputs were written (not NaN bytes) and hold attention over a real retrieval: close
  // to, not equal to, full attention is not asserted here (the pool is small); finite is.
  for (const auto& x : s) {
    for (const float v : x->o.download()) CHECK(std::isfinite(v));
  }
}

TEST_CASE("decode_step_sharded_routes_each_shard_as_decode_step_with_routes", "[cuda][sharded]") {
  // Shards 0 and 2 route their queries (the best 2 of 8 random routing rows per graph, lists of
  // 6 random tokens; routing group 1 and 2), shard 1 does not: each shard's outputs equal
  // decode_step's with the same routes (or none) on device 0, bit for bit, and a routed shard's
  // retrieval differs from the same shard's without routes (its routes reached the search:
  // with expand_limit 2 a search barely moves from its seeds).
  const int second = second_device();
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 16;
  p.search.L = 32;
  p.search.expand_limit = 2;
  const layer l = make_layer({1500, 700, 2000, 1200, 900}, 4, 128, p.sink);
  const std::vector<int> cuts{0, 2, 4, 5};
  const shards_t s = cut(l, cuts, {0, second, second}, p);
  const shards_t ref = cut(l, cuts, {0, 0, 0}, p);
  const shards_t plain = cut(l, cuts, {0, 0, 0}, p);
  for (const int i : {0, 2}) {
    kc::route_params rp;
    rp.top = 2;
    rp.group = i == 0 ? 1 : 2;
    for (const auto* side : {&s, &ref}) {
      rng().seed(40 + static_cast<unsigned>(i));
      (*side)[static_cast<std::size_t>(i)]->add_routes(l, 8, 6, rp, p);
    }
  }
  for (int step = 0; step < 2; ++step) {  // the second from the first's carry and the routes
    run_steps(s, l.d, p);
    for (const shards_t* side : {&ref, &plain}) {
      for (const auto& r : *side) {
        if (r->routes) {
          kc::decode_step(r->set, *r->routes, r->kv, r->q.get(), r->heads, l.d, r->o.get(),
                          r->lse.get(), r->ws.get(), r->ws_bytes, nullptr, p, r->status.get(),
                          r->carry.get());
        } else {
          kc::decode_step(r->set, r->kv, r->q.get(), r->heads, l.d, r->o.get(), r->lse.get(),
                          r->ws.get(), r->ws_bytes, nullptr, p, r->status.get(), r->carry.get());
        }
      }
    }
    sync_all();
    for (std::size_t i = 0; i < s.size(); ++i) {
      INFO("step " << step << ", shard " << i << " on device " << s[i]->device);
      CHECK(same_bits(s[i]->o.download(), ref[i]->o.download()));
      CHECK(same_bits(s[i]->lse.download(), ref[i]->lse.download()));
      CHECK(same_bits(s[i]->carry.download(), ref[i]->carry.download()));
      CHECK(s[i]->status.download()[0] == 0u);
      CHECK(same_bits(s[i]->carry.download(), plain[i]->carry.download()) == !s[i]->routes);
    }
  }
}

TEST_CASE("decode_search_sharded_equals_decode_search_per_shard", "[cuda][sharded]") {
  const int second = second_device();
  kc::decode_step_params p;
  p.search.k = 20;
  p.search.L = 40;
  const layer l = make_layer({1500, 800, 1100, 600}, 2, 64, 0);
  const std::vector<int> cuts{0, 1, 3, 4};
  const shards_t s = cut(l, cuts, {second, 0, second}, p);
  const shards_t ref = cut(l, cuts, {0, 0, 0}, p);
  auto compare = [&](const char* keys) {
    sync_all();
    for (std::size_t i = 0; i < s.size(); ++i) {
      INFO(keys << " keys, shard " << i << " on device " << s[i]->device);
      CHECK(same_bits(s[i]->ids.download(), ref[i]->ids.download()));
      CHECK(same_bits(s[i]->scores.download(), ref[i]->scores.download()));
      CHECK(same_bits(s[i]->counts.download(), ref[i]->counts.download()));
      CHECK(s[i]->status.download()[0] == 0u);
      const auto counts = s[i]->counts.download();
      CHECK(std::all_of(counts.begin(), counts.end(), [](std::uint32_t c) { return c == 20; }));
    }
  };
  {  // paged keys
    std::vector<kc::decode_search_shard<kc::paged_kv_ref<float>>> args;
    for (const auto& x : s) {
      args.push_back({x->device, x->set, x->kv, x->queries(), x->heads, x->search_outputs(),
                      x->ws.get(), x->ws_bytes, x->stream});
    }
    kc::decode_search_sharded<kc::paged_kv_ref<float>>(args, p.search);
    for (const auto& r : ref) {
      kc::decode_search(r->set, r->kv, r->queries(), r->heads, p.search, r->search_outputs(),
                        r->ws.get(), r->ws_bytes, nullptr);
    }
    compare("paged");
  }
  {  // dense keys (the shard's graphs' keys concatenated), into cleared outputs
    for (const auto* side : {&s, &ref}) {
      for (const auto& x : *side) {  // cudaMemset needs the memory's own device current
        KVSIFT_CUDA_CHECK(cudaSetDevice(x->device));
        KVSIFT_CUDA_CHECK(cudaMemset(x->ids.get(), 0xFF, x->ids.size() * sizeof(id_t)));
        KVSIFT_CUDA_CHECK(cudaMemset(x->scores.get(), 0xFF, x->scores.size() * sizeof(float)));
      }
    }
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
    std::vector<kc::decode_search_shard<kc::dense_keys_ref<float>>> args;
    for (const auto& x : s) {
      args.push_back({x->device,
                      x->set,
                      {x->dense.get(), l.d, l.d},
                      x->queries(),
                      x->heads,
                      x->search_outputs(),
                      x->ws.get(),
                      x->ws_bytes,
                      x->stream});
    }
    kc::decode_search_sharded<kc::dense_keys_ref<float>>(args, p.search);
    for (const auto& r : ref) {
      kc::decode_search(r->set, kc::dense_keys_ref<float>{r->dense.get(), l.d, l.d}, r->queries(),
                        r->heads, p.search, r->search_outputs(), r->ws.get(), r->ws_bytes, nullptr);
    }
    compare("dense");
  }
}

TEST_CASE("decode_step_sharded_refuses_a_bad_shard_before_enqueuing_any", "[cuda][sharded]") {
  const int second = second_device();
  int devices = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 16;
  p.search.L = 32;
  const layer l = make_layer({600, 800}, 2, 64, p.sink);
  const shards_t s = cut(l, {0, 1, 2}, {0, second}, p);
  std::vector<kc::decode_step_shard<float>> good;
  for (const auto& x : s) good.push_back(x->step_args());

  // Each case spoils shard 1; shard 0 (valid, first in line) must not have been enqueued.
  auto refused = [&](std::vector<kc::decode_step_shard<float>> args, const std::string& part) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(second));
    const std::string m = message_of([&] { kc::decode_step_sharded<float>(args, l.d, p); });
    INFO(m);
    CHECK(contains(m, "decode_step_sharded: shard 1"));
    CHECK(contains(m, part.c_str()));
    int current = -1;
    KVSIFT_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == second);  // restored on the error path too
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
    sync_all();
    for (const float v : s[0]->o.download()) REQUIRE(std::isnan(v));
  };
  auto spoil = [&](auto&& change) {
    auto args = good;
    change(args[1]);
    return args;
  };
  refused(spoil([](auto& a) { a.device = -1; }), "expected a device in [0, ");
  refused(spoil([&](auto& a) { a.device = devices; }), "expected a device in [0, ");
  refused(spoil([](auto& a) { a.workspace_bytes -= 1; }), "decode_step: workspace of ");
  refused(spoil([](auto& a) { a.num_qo_heads = 0; }), "a positive multiple of num_graphs");
  refused(spoil([](auto& a) { a.out_lse = nullptr; }), "out_lse");
  {  // shard 1's routes: a routing group (2 and 3) that does not divide its GQA group of 2
    kc::route_params rp;
    rp.group = 2;
    s[1]->add_routes(l, 4, 3, rp, p);
    good[1] = s[1]->step_args();
    refused(spoil([](auto& a) { a.routes->params.group = 3; }),
            "decode_step: expected a routing group dividing the GQA group (2), got 3");
    refused(spoil([](auto& a) { a.workspace_bytes -= 1; }), "decode_step: workspace of ");
  }
  // The subclass survives the shard's context: a K/V head_dim that is not the queries'.
  {
    auto args = spoil([](auto& a) { a.kv.head_dim = 128; });
    CHECK_THROWS_AS(kc::decode_step_sharded<float>(args, l.d, p), kvsift::dimension_mismatch);
    sync_all();
    for (const float v : s[0]->o.download()) REQUIRE(std::isnan(v));
  }
  // Nothing to do: no shard, no error.
  kc::decode_step_sharded<float>(std::span<const kc::decode_step_shard<float>>(), l.d, p);

  if (devices < 2) {
    std::printf("  (one device: the foreign-device shards are not exercised)\n");
  } else {
    // Shard 1's memory lives on device 1; said to be device 0's, it is refused there (with the
    // default stream in place of its own, device 1's stream, so that the memory is checked).
    refused(spoil([](auto& a) {
              a.device = 0;
              a.stream = nullptr;
            }),
            "lives on device 1, expected the current device 0");
    // Its device right but a stream of device 0.
    cudaStream_t other = nullptr;
    KVSIFT_CUDA_CHECK(cudaStreamCreate(&other));  // device 0 is current
    refused(spoil([&](auto& a) { a.stream = other; }),
            "the stream belongs to device 0, expected the current device 1");
    KVSIFT_CUDA_CHECK(cudaStreamDestroy(other));
  }
  // The valid shards still run after all that.
  kc::decode_step_sharded<float>(good, l.d, p);
  sync_all();
  for (const auto& x : s) {
    for (const float v : x->o.download()) CHECK(std::isfinite(v));
  }
}

TEST_CASE("decode_search_sharded_refuses_a_bad_shard_naming_it", "[cuda][sharded]") {
  const int second = second_device();
  kc::decode_step_params p;
  p.search.k = 8;
  p.search.L = 16;
  const layer l = make_layer({300, 400}, 1, 64, 0);
  const shards_t s = cut(l, {0, 1, 2}, {second, 0}, p);
  std::vector<kc::decode_search_shard<kc::paged_kv_ref<float>>> args;
  for (const auto& x : s) {
    args.push_back({x->device, x->set, x->kv, x->queries(), x->heads, x->search_outputs(),
                    x->ws.get(), x->ws_bytes, x->stream});
  }
  auto bad = args;
  bad[1].queries.ld = 32;  // below the keys' dim
  CHECK_THROWS_AS(kc::decode_search_sharded<kc::paged_kv_ref<float>>(bad, p.search),
                  kvsift::dimension_mismatch);
  const std::string m =
      message_of([&] { kc::decode_search_sharded<kc::paged_kv_ref<float>>(bad, p.search); });
  INFO(m);
  CHECK(contains(m,
                 "decode_search_sharded: shard 1 (device 0): decode_search: expected a query "
                 "row stride >= dim = 64, got 32"));
  sync_all();
  for (const id_t v : s[0]->ids.download()) REQUIRE(v == kvsift::invalid_id);  // not enqueued
  kc::decode_search_sharded<kc::paged_kv_ref<float>>(args, p.search);
  sync_all();
  for (const auto& x : s) {
    const auto counts = x->counts.download();
    CHECK(std::all_of(counts.begin(), counts.end(), [](std::uint32_t c) { return c == 8; }));
  }
}

// The decode entry points themselves refuse another device's stream and memory (issue 20; the
// other entry points' cases are in device_checks_test.cu and their own tests). Each call is made
// valid first.
TEST_CASE("decode_entry_points_check_devices", "[cuda][sharded][device_checks]") {
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 8;
  p.search.L = 16;
  const layer l = make_layer({300, 400}, 2, 64, p.sink);
  const shards_t s = cut(l, {0, 2}, {0}, p);
  const shard& x = *s[0];
  const int cap = kc::decode_search_capacity(p.search);
  device_buffer<std::int64_t> indptr(static_cast<std::size_t>(x.heads) + 1);
  device_buffer<std::int32_t> indices(static_cast<std::size_t>(x.heads) * cap);
  using call = std::function<void(cudaStream_t)>;
  const std::vector<std::pair<const char*, call>> calls{
      {"decode_search (paged)",
       [&](cudaStream_t st) {
         kc::decode_search(x.set, x.kv, x.queries(), x.heads, p.search, x.search_outputs(),
                           x.ws.get(), x.ws_bytes, st);
       }},
      {"decode_search (dense)",
       [&](cudaStream_t st) {
         kc::decode_search(x.set, kc::dense_keys_ref<float>{x.dense.get(), l.d, l.d}, x.queries(),
                           x.heads, p.search, x.search_outputs(), x.ws.get(), x.ws_bytes, st);
       }},
      {"decode_results_to_csr",
       [&](cudaStream_t st) {
         kc::decode_results_to_csr(x.ids.get(), x.counts.get(), x.heads, cap, indptr.get(),
                                   indices.get(), st);
       }},
      {"decode_step", [&](cudaStream_t st) {
         kc::decode_step(x.set, x.kv, x.q.get(), x.heads, l.d, x.o.get(), x.lse.get(), x.ws.get(),
                         x.ws_bytes, st, p, x.status.get(), x.carry.get());
       }}};
  for (const auto& [name, f] : calls) {
    INFO(name);
    f(nullptr);  // valid
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const bool two = with_foreign_stream([&](cudaStream_t foreign) {
      const std::string m = message_of([&] { f(foreign); });
      INFO(m);
      CHECK(contains(m, "the stream belongs to device 1, expected the current device 0"));
    });
    if (two) {
      KVSIFT_CUDA_CHECK(cudaSetDevice(1));
      const std::string m = message_of([&] { f(nullptr); });
      KVSIFT_CUDA_CHECK(cudaSetDevice(0));
      INFO(m);
      CHECK(contains(m, "lives on device 0, expected the current device 1"));
    }
  }
}
