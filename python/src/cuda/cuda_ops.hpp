#pragma once
// The CUDA operations of kvsift._kvsift_cuda as plain C++ functions over raw device pointers:
// the nvcc-compiled half (cuda_ops.cu, which instantiates kvsift::cuda's kernels) behind a
// header the host-compiled pybind11 half (cuda_module.cpp) can include without CUDA headers.
// Every function enqueues on `stream` (a cudaStream_t as an integer, 0 = legacy default) and
// returns without synchronising; argument checks are kvsift::cuda's own (kvsift::
// invalid_argument / dimension_mismatch; a kvsift::cuda_error comes out as cuda_failure).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvsift_python::cuda_ops {

/// kvsift::cuda_error (a failed launch or runtime call) as seen from code compiled without
/// the CUDA headers; the module turns it into kvsift.cuda.CudaError (a RuntimeError).
class cuda_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element type of K/V or of merged outputs.
enum class dtype { f32, f16, bf16 };

/// The current CUDA device (cudaGetDevice). @throw kvsift::cuda::cuda_error
int current_device();

/// kvsift::cuda::merge_state: out = merge((v_a, s_a), (v_b, s_b)), natural-log lse.
void merge_state(dtype t, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                 void* v_out, float* s_out, std::int64_t rows, int heads, int dim,
                 std::intptr_t stream, int* status);

/// kvsift::cuda::merge_state_in_place: (v, s) <- merge((v, s), (v_other, s_other)).
void merge_state_in_place(dtype t, void* v, float* s, const void* v_other, const float* s_other,
                          std::int64_t rows, int heads, int dim, std::intptr_t stream, int* status);

/// kvsift::cuda::merge_states: position p merges states indptr[p] .. indptr[p + 1].
void merge_states(dtype t, const void* v, const float* s, std::int64_t num_states,
                  const std::int64_t* indptr, std::int64_t num_pos, int heads, int dim, void* v_out,
                  float* s_out, std::intptr_t stream, int* status);

/// kvsift::cuda::sparse_attention_workspace_size. `num_splits` 0 = automatic.
std::size_t sparse_attention_workspace_size(int qo_heads, int dim, int num_splits);

/// kvsift::cuda::sparse_attention over head-wise paged K/V. `scale` NaN = 1 / sqrt(dim).
void sparse_attention(dtype kv, const float* q, int qo_heads, int dim, const void* k_pages,
                      const void* v_pages, std::int64_t num_pages, int page_size,
                      const std::int32_t* page_table, int kv_heads, int max_pages_per_head,
                      const std::int64_t* indptr, const std::int32_t* ids, float* out_o,
                      float* out_lse, void* workspace, std::size_t workspace_bytes, float scale,
                      int num_splits, std::intptr_t stream, int* status);

/// The graphs of a kvsift::cuda::graph_set_ref (device pointers; ids as uint32 bits).
struct decode_graphs {
  const std::uint32_t* adjacency = nullptr;  ///< [rows][width]
  const std::int64_t* row_offset = nullptr;  ///< [num_graphs + 1]
  const std::uint32_t* entries = nullptr;    ///< [num_graphs][max_entries]
  int num_graphs = 0;
  int width = 0;
  int max_entries = 0;
  std::int64_t max_keys = 0;
  /// [num_graphs] keys each graph holds (rows past it are spare), or null: every row.
  /// Writable: batch_insert increments it.
  std::uint32_t* sizes = nullptr;
};

/// kvsift::cuda::decode_search_params as plain fields.
struct decode_search_knobs {
  bool dipr = false;
  bool l2 = false;  ///< metric: squared l2 distance instead of inner product
  int k = 100;
  int L = 128;
  int expand_width = 1;
  bool walk_through = true;
  int degree_cap = 0;
  float beta = 1.0f;
  int l0 = 64;
  int max_results = 0;
  int expand_limit = 0;  ///< top-k: pool entries that may be expanded (0 = L)
  int max_hops = 0;      ///< top-k: nodes a search may expand (0 = no cap)
  int entry_prefix = 0;  ///< also enter each search at its graph's ids [0, entry_prefix)
};

/// The queries of a decode search (device pointers; the optional ones may be null).
struct decode_search_queries {
  const float* q = nullptr;  ///< [m][dim]
  const std::int32_t* graph = nullptr;
  const float* seed_score = nullptr;
  const std::uint32_t* filter_first = nullptr;
  const std::uint32_t* filter_last = nullptr;
  const std::uint32_t* seeds = nullptr;  ///< [m][seeds_ld] own entry points, or null
  int seeds_ld = 0;
};

/// The outputs of a decode search (device pointers; best and status may be null).
struct decode_search_outputs {
  std::uint32_t* ids = nullptr;     ///< [m][capacity]
  float* scores = nullptr;          ///< [m][capacity]
  std::uint32_t* counts = nullptr;  ///< [m]
  std::uint32_t* scored = nullptr;  ///< [m]
  float* best = nullptr;            ///< [m]
  std::uint32_t* status = nullptr;
  std::uint32_t* capped = nullptr;  ///< [m] DIPR: 1 where the search hit a cap
};

/// kvsift::cuda::decode_search_capacity: result slots per query.
int decode_search_capacity(const decode_search_knobs& p);

/// kvsift::cuda::decode_search_workspace_size for m queries.
std::size_t decode_search_workspace_size(const decode_graphs& g, std::int64_t m,
                                         const decode_search_knobs& p);

/// Where a graph set's keys live: rows row_offset[g].. of one dense [rows][dim] matrix
/// (`dense`), or head-wise paged K memory whose page-table row g holds graph g's keys.
struct graph_keys {
  dtype type = dtype::f32;
  int dim = 0;
  const void* dense = nullptr;    ///< [rows][dim], or null: paged
  const void* k_pages = nullptr;  ///< [num_pages][page_size][dim]
  std::int64_t num_pages = 0;
  int page_size = 0;
  const std::int32_t* page_table = nullptr;  ///< [table_rows][max_pages_per_head]
  int table_rows = 0;
  int max_pages_per_head = 0;
};

/// kvsift::cuda::decode_search over the keys where they live.
void decode_search(const decode_graphs& g, const graph_keys& keys, const decode_search_queries& q,
                   std::int64_t m, const decode_search_knobs& p, const decode_search_outputs& out,
                   void* workspace, std::size_t workspace_bytes, std::intptr_t stream);

/// kvsift::cuda::decode_results_to_csr: padded rows to indptr [m + 1] / indices [m * capacity].
void decode_results_to_csr(const std::uint32_t* ids, const std::uint32_t* counts, std::int64_t m,
                           int capacity, std::int64_t* indptr, std::int32_t* indices,
                           std::intptr_t stream);

/// The routing sets of a kvsift::cuda::route_set_ref (device pointers; ids as uint32 bits), as
/// kvsift::stack_route_sets lays them out: rows of `dim` elements, contiguous.
struct route_sets {
  dtype type = dtype::f32;        ///< of vectors and centroids
  const void* vectors = nullptr;  ///< [offset[num_graphs]][dim]
  int dim = 0;
  const std::uint32_t* lists = nullptr;  ///< [offset[num_graphs]][list_len]
  int list_len = 0;
  const std::int64_t* offset = nullptr;  ///< [num_graphs + 1]
  int num_graphs = 0;
  int max_rows = 0;
  const void* centroids = nullptr;               ///< [clusters][dim], or null: not clustered
  const std::int64_t* cluster_offset = nullptr;  ///< [num_graphs + 1], or null
  const std::int64_t* cluster_rows = nullptr;    ///< [clusters + 1], or null
  int max_clusters = 0;
  int max_cluster_rows = 0;
};

/// kvsift::cuda::route_seeds_ld: seeds per query (top x list_len).
int route_seeds_ld(int list_len, int top, int group, int probe);

/// kvsift::cuda::route_seeds: q [m][dim] float32, graph [m]; seeds [m][route_seeds_ld].
void route_seeds(const route_sets& r, const float* q, const std::int32_t* graph, std::int64_t m,
                 int top, int group, int probe, std::uint32_t* seeds, std::uint32_t* status,
                 std::intptr_t stream);

/// kvsift::cuda::decode_step_params as plain fields. `scale` NaN = 1 / sqrt(dim).
struct decode_step_knobs {
  decode_search_knobs search;
  int sink = 4;
  int window = 512;
  int unindexed = 0;  ///< tokens past the graphs' rows, attended with the window
  float scale = std::numeric_limits<float>::quiet_NaN();
  bool dense_when_capped = false;  ///< DIPR: a capped head attends every token
  bool seed_from_window = false;   ///< DIPR: seeded with each head's best window score
};

/// The routing of decode_step with routes (kvsift::cuda::decode_step_routes); `sets` null: none.
/// The workspace size reads only sets->list_len.
struct step_routing {
  const route_sets* sets = nullptr;
  int top = 4;
  int group = 1;
  int probe = 0;
};

/// kvsift::cuda::decode_step_workspace_size (with routes when r.sets is given).
std::size_t decode_step_workspace_size(const decode_graphs& g, int qo_heads, int dim,
                                       const decode_step_knobs& p, const step_routing& r = {});

/// kvsift::cuda::decode_step over head-wise paged K/V whose page-table row g is graph g's KV
/// head: search, sparse attention over the retrieved and the window tokens, merge.
void decode_step(dtype kv, const decode_graphs& g, const void* k_pages, const void* v_pages,
                 std::int64_t num_pages, int page_size, const std::int32_t* page_table,
                 int max_pages_per_head, const float* q, int qo_heads, int dim, float* out_o,
                 float* out_lse, void* workspace, std::size_t workspace_bytes,
                 const decode_step_knobs& p, std::uint32_t* status, std::intptr_t stream,
                 std::uint32_t* carry = nullptr, std::uint32_t* capped = nullptr,
                 const step_routing& routes = {});

/// One graph's list arrays from kvsift::cuda::make_insert_lists (host vectors).
struct insert_lists {
  std::vector<std::uint32_t> knn_ids, best_id, holders, holder_counts, layouts;
  std::vector<float> knn_keys, worst_key, best_key;
};

/// kvsift::cuda::make_insert_lists: the list arrays of one graph from its training kNN (ids and
/// raw scores, m x nq) for a graph of `rows` rows.
insert_lists make_insert_lists(const std::vector<std::uint32_t>& ids,
                               const std::vector<float>& scores, std::size_t m, std::size_t nq,
                               std::size_t rows, int holder_capacity, bool l2);

/// kvsift::cuda::batch_insert_state_ref as device pointers (adjacency and sizes are the
/// graphs').
struct insert_state {
  const float* queries = nullptr;  ///< [query_offset[G]][query_ld]
  std::int64_t query_ld = 0;
  const std::int64_t* query_offset = nullptr;  ///< [G + 1]
  std::int64_t max_queries = 0;
  int nq = 0;
  std::uint32_t* knn_ids = nullptr;
  float* knn_keys = nullptr;
  float* worst_key = nullptr;
  std::uint32_t* best_id = nullptr;
  float* best_key = nullptr;
  std::uint32_t* holders = nullptr;
  std::uint32_t* holder_counts = nullptr;
  int holder_capacity = 0;
  std::uint32_t* layouts = nullptr;  ///< or null
};

/// kvsift::cuda::batch_insert_params as plain fields.
struct insert_knobs {
  int degree = 0;
  int L = 48;
  int expand_width = 1;
  int query_neighbors = 4;
  int query_candidates = 512;
  bool update_query_knn = true;
  bool fill = true;
  bool l2 = false;
};

/// kvsift::cuda::batch_insert_workspace_size (only the state's sizes are read).
std::size_t batch_insert_workspace_size(const decode_graphs& g, int dim, const insert_state& st,
                                        const insert_knobs& p);

/// kvsift::cuda::batch_insert: key sizes[g] of every graph g, read where the keys live.
void batch_insert(const decode_graphs& g, const graph_keys& keys, const insert_state& st,
                  const insert_knobs& p, void* workspace, std::size_t workspace_bytes,
                  std::intptr_t stream, std::uint32_t* status);

/// kvsift::cuda::knn_workspace_size with the default tiles.
std::size_t knn_workspace_size(std::int64_t m, std::int64_t n, int k);

/// kvsift::cuda::knn: row i of out_scores / out_ids (m x k) holds query i's k best keys by
/// inner product, best first. Ids are written as int32 (the caller checked n <= INT32_MAX, so
/// kvsift's uint32 ids have the same bits). Uses a cuBLAS handle of the current device that
/// this library keeps for the process (created on first use, never destroyed: destroying it
/// at interpreter exit can run after the CUDA context is gone); calls are serialised on it.
void knn(dtype t, const void* queries, std::int64_t m, const void* keys, std::int64_t n, int dim,
         int k, float* out_scores, std::int32_t* out_ids, void* workspace,
         std::size_t workspace_bytes, std::intptr_t stream);

/// roargraph_params of a build as plain fields.
struct build_knobs {
  std::size_t nq = 100;
  std::size_t M = 35;
  std::size_t L = 500;
  std::size_t threads = 0;
  std::uint64_t seed = 2024;
};

/// A built graph in write_graph's layout, and the build's seconds per phase.
struct built_graph {
  std::string bytes;
  double knn_seconds = 0, projection_seconds = 0, connectivity_seconds = 0, total_seconds = 0;
};

/// kvsift::roargraph_builder<inner_product, kvsift::cuda::knn_engine> on the current device:
/// the training kNN and the step-3 searches on the GPU, the rest on `threads` CPU threads, over
/// host keys [n][dim] (f32 or f16; bf16 is refused) and host f32 training queries [m][dim].
/// The graph equals the CPU build's on data whose scores are exact.
built_graph build_roargraph(dtype t, const void* keys, std::int64_t n, int dim, const float* train,
                            std::int64_t m, const build_knobs& p);

/// One head of build_roargraphs: host keys [n][dim] and host f32 training queries [m][dim].
struct build_head {
  const void* keys = nullptr;
  std::int64_t n = 0;
  const float* train = nullptr;
  std::int64_t m = 0;
};

/// build_roargraph for several heads at once (kvsift::build_heads_sharded): `builders` builders,
/// builder b on devices[b % devices.size()] (the current device when `devices` is empty), each
/// with its own engine and threads / builders CPU threads (all the host's when threads is 0),
/// build contiguous shards of the heads on their own threads. Graph h equals build_roargraph of
/// head h alone. Throws kvsift::invalid_argument for a device id outside [0, device count) or
/// fewer builders than devices, before anything is built.
std::vector<built_graph> build_roargraphs(dtype t, const std::vector<build_head>& heads, int dim,
                                          const build_knobs& p, int builders,
                                          const std::vector<int>& devices);

/// Whether `p` is page-locked host memory the device can read (cudaPointerGetAttributes).
bool is_pinned_host(const void* p);

/// kvsift::cuda::gather_pages (`gather`) or scatter_pages: `copies` holds `count` (cpu_page,
/// gpu_page) pairs of uint64 in device memory; pools of `page_bytes`-sized pages.
void copy_pages(bool gather, const void* copies, std::uint64_t count, void* host,
                std::uint64_t host_pages, void* device, std::uint64_t device_pages,
                std::uint64_t page_bytes, int* status, std::intptr_t stream);

/// kvsift::cuda::bucketed_lru_step over `pairs` LRUs of `capacity` slots and `pages` pages,
/// all arrays device memory laid out as bucketed_lru_ref / lru_step_io say; `limits` (per-pair
/// slot limits, or null) with a nonzero `eviction_stride` (evictions of pair p at p x stride).
void bucketed_lru_step(std::uint32_t* keys, std::uint8_t* ages, std::uint32_t* slot_of,
                       std::uint32_t pairs, std::uint32_t capacity, std::uint32_t pages,
                       const std::uint32_t* selected, const std::uint64_t* offsets,
                       std::uint32_t* evicted_keys, std::uint32_t* evicted_slots,
                       std::uint32_t* admitted_keys, std::uint32_t* admitted_slots,
                       std::uint32_t* counts, int* status, int buckets, std::intptr_t stream,
                       const std::uint32_t* limits, std::uint64_t eviction_stride);

/// One layer's offloaded K/V as kvsift::cuda::offloaded_kv_ref's fields (device pointers,
/// except the host tiers, which are pinned host memory; host_page may be either).
struct offloaded_layer {
  std::uint32_t* keys = nullptr;             ///< LRU state [pairs][capacity]
  std::uint8_t* ages = nullptr;              ///< [pairs][capacity]
  std::uint32_t* slot_of = nullptr;          ///< [pairs][pages]
  std::int32_t* page_table = nullptr;        ///< [pairs][pages]
  const std::uint64_t* host_page = nullptr;  ///< [pairs][pages]
  std::uint32_t pairs = 0, capacity = 0, pages = 0;
  void* k_host = nullptr;
  void* v_host = nullptr;
  std::uint64_t host_pages = 0;
  void* k_device = nullptr;
  void* v_device = nullptr;
  std::uint64_t device_pages = 0;
  int page_size = 0;
  int dim = 0;
  const std::uint32_t* limits = nullptr;  ///< [pairs] device, or null (every pair: capacity)
};

/// kvsift::cuda::offloaded_reset.
void offloaded_reset(dtype t, const offloaded_layer& l, std::intptr_t stream);

/// kvsift::cuda::offloaded_attention_workspace_size (attention split count automatic).
std::size_t offloaded_attention_workspace_size(dtype t, const offloaded_layer& l, int qo_heads,
                                               std::size_t max_ids);

/// kvsift::cuda::offloaded_attention<T> for K/V of element type `t`. `scale` NaN = 1/sqrt(dim).
void offloaded_attention(dtype t, const offloaded_layer& l, const float* q, int qo_heads,
                         const std::int64_t* indptr, const std::int32_t* ids, std::size_t max_ids,
                         float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                         float scale, int buckets, std::intptr_t stream, int* status);

}  // namespace kvsift_python::cuda_ops
