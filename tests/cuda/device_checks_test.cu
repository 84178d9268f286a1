// Every CUDA entry point refuses memory it cannot use on the current device before it launches
// anything: pageable host memory and, for device-only arguments, pinned host memory (one GPU),
// a stream of another device and device memory of another device (two GPUs; with one, those
// checks say so and are not exercised). Each call is first made with valid arguments, so a
// check that refused valid input would fail here too.

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/cuda/merge.cuh>
#include <kvsift/cuda/page_gather.cuh>
#include <kvsift/cuda/sparse_attention.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;

/// A call with every argument valid except the ones a case replaces.
using call = std::function<void(cudaStream_t)>;

void runs(const call& f) {
  f(nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
}

void refused(const std::function<void()>& f, const char* part, const char* name) {
  const std::string m = message_of(f);
  INFO(m);
  CHECK(contains(m, part));
  CHECK(contains(m, name));
}

/// The two-GPU cases: a stream of device 1 while device 0 is current, and the call (whose
/// memory is device 0's) made while device 1 is current.
void foreign_device_cases(const call& f) {
  with_foreign_stream([&](cudaStream_t other) {
    refused([&] { f(other); }, "the stream belongs to device 1", "expected the current device 0");
    KVSIFT_CUDA_CHECK(cudaSetDevice(1));
    refused([&] { f(nullptr); }, "lives on device 0", "expected the current device 1");
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
  });
}

}  // namespace

TEST_CASE("merge_entry_points_check_devices", "[cuda][device_checks]") {
  constexpr int pos = 4, heads = 2, d = 16;
  device_buffer<float> o(2 * pos * heads * d), lse(2 * pos * heads), out(pos * heads * d),
      out_lse(pos * heads);
  KVSIFT_CUDA_CHECK(cudaMemset(o.get(), 0, o.size() * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMemset(lse.get(), 0, lse.size() * sizeof(float)));
  device_buffer<std::int64_t> indptr(std::vector<std::int64_t>{0, 2, 4, 6, 8});
  std::vector<float> host(out.size());
  std::vector<float> host_lse(out_lse.size());
  pinned_bytes pinned(out.size() * sizeof(float));
  auto* pinned_o = static_cast<float*>(pinned.p);

  const auto states = [&](float* dst, float* dst_lse, const std::int64_t* ip) {
    return [=, &o, &lse](cudaStream_t s) {
      kvsift::cuda::merge_states<float>(o.get(), lse.get(), 2 * pos, ip, pos, heads, d, dst,
                                        dst_lse, s);
    };
  };
  runs(states(out.get(), out_lse.get(), indptr.get()));
  refused([&] { states(host.data(), out_lse.get(), indptr.get())(nullptr); }, "host pointer",
          "out_o");
  refused([&] { states(pinned_o, out_lse.get(), indptr.get())(nullptr); }, "host pointer", "out_o");
  refused([&] { states(out.get(), host_lse.data(), indptr.get())(nullptr); }, "host pointer",
          "out_lse");
  std::vector<std::int64_t> host_indptr{0, 2, 4, 6, 8};
  refused([&] { states(out.get(), out_lse.get(), host_indptr.data())(nullptr); }, "host pointer",
          "indptr");
  foreign_device_cases(states(out.get(), out_lse.get(), indptr.get()));

  const float* a = o.get();
  const float* b = o.get() + pos * heads * d;
  const auto pair = [&](const float* va, float* dst) {
    return [=, &lse, &out_lse](cudaStream_t s) {
      kvsift::cuda::merge_state<float>(va, lse.get(), b, lse.get() + pos * heads, dst,
                                       out_lse.get(), pos, heads, d, s);
    };
  };
  runs(pair(a, out.get()));
  refused([&] { pair(host.data(), out.get())(nullptr); }, "host pointer", "v_a");
  refused([&] { pair(a, pinned_o)(nullptr); }, "host pointer", "v_out");
  foreign_device_cases(pair(a, out.get()));

  const auto in_place = [&](float* v, const float* other_lse) {
    return [=, &lse](cudaStream_t s) {
      kvsift::cuda::merge_state_in_place<float>(v, lse.get(), b, other_lse, pos, heads, d, s);
    };
  };
  runs(in_place(o.get(), lse.get() + pos * heads));
  refused([&] { in_place(host.data(), lse.get() + pos * heads)(nullptr); }, "host pointer", "v");
  refused([&] { in_place(o.get(), host_lse.data())(nullptr); }, "host pointer", "s_other");
  foreign_device_cases(in_place(o.get(), lse.get() + pos * heads));

  // An optional status word must be device memory too.
  int host_status = 0;
  refused(
      [&] {
        kvsift::cuda::merge_state<float>(a, lse.get(), b, lse.get() + pos * heads, out.get(),
                                         out_lse.get(), pos, heads, d, nullptr, {}, &host_status);
      },
      "host pointer", "status");
}

TEST_CASE("sparse_attention_checks_devices", "[cuda][device_checks]") {
  constexpr int d = 64, page = 4, pages = 2, heads = 2;
  device_buffer<float> k(pages * page * d), v(pages * page * d), q(heads * d), out(heads * d),
      out_lse(heads);
  KVSIFT_CUDA_CHECK(cudaMemset(k.get(), 0, k.size() * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMemset(v.get(), 0, v.size() * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMemset(q.get(), 0, q.size() * sizeof(float)));
  device_buffer<std::int32_t> table(std::vector<std::int32_t>{0, 1});
  device_buffer<std::int64_t> indptr(std::vector<std::int64_t>{0, 3, 5});
  device_buffer<std::int32_t> ids(std::vector<std::int32_t>{0, 5, 7, 1, 2});
  std::vector<float> host_q(q.size());
  std::vector<std::int32_t> host_ids{0, 5, 7, 1, 2};
  kvsift::cuda::sparse_attention_params one_split;
  one_split.num_splits = 1;  // no workspace
  const auto attend = [&](const float* qq, const float* kk, const std::int32_t* tt,
                          const std::int32_t* ii) {
    return [=, &v, &indptr, &out, &out_lse](cudaStream_t s) {
      const kvsift::cuda::paged_kv_ref<float> kv{kk, v.get(), pages, page, d, tt, 1, pages};
      kvsift::cuda::sparse_attention<float>(qq, heads, d, kv, indptr.get(), ii, out.get(),
                                            out_lse.get(), nullptr, 0, s, one_split);
    };
  };
  runs(attend(q.get(), k.get(), table.get(), ids.get()));
  refused([&] { attend(host_q.data(), k.get(), table.get(), ids.get())(nullptr); }, "host pointer",
          "q");
  std::vector<float> host_k(k.size());
  refused([&] { attend(q.get(), host_k.data(), table.get(), ids.get())(nullptr); }, "host pointer",
          "k_pages");
  std::vector<std::int32_t> host_table{0, 1};
  refused([&] { attend(q.get(), k.get(), host_table.data(), ids.get())(nullptr); }, "host pointer",
          "page_table");
  refused([&] { attend(q.get(), k.get(), table.get(), host_ids.data())(nullptr); }, "host pointer",
          "token_ids");
  foreign_device_cases(attend(q.get(), k.get(), table.get(), ids.get()));
}

TEST_CASE("page_copies_check_devices", "[cuda][device_checks]") {
  constexpr std::uint64_t page_bytes = 64;
  pinned_bytes host_pool(2 * page_bytes);
  std::memset(host_pool.p, 1, 2 * page_bytes);
  device_buffer<unsigned char> device_pool(2 * page_bytes);
  const std::vector<kvsift::page_copy> list{{0, 1}, {1, 0}};
  device_buffer<kvsift::page_copy> copies(list);
  pinned_bytes pinned_list(list.size() * sizeof(kvsift::page_copy));
  std::memcpy(pinned_list.p, list.data(), list.size() * sizeof(kvsift::page_copy));
  std::vector<unsigned char> pageable(2 * page_bytes);
  const auto gather = [&](const kvsift::page_copy* c, void* host, void* dev, bool to_device) {
    return [=](cudaStream_t s) {
      const kvsift::cuda::page_pools_ref pools{host, 2, dev, 2, page_bytes};
      if (to_device) {
        kvsift::cuda::gather_pages(c, 2, pools, nullptr, s);
      } else {
        kvsift::cuda::scatter_pages(c, 2, pools, nullptr, s);
      }
    };
  };
  for (const bool to_device : {true, false}) {
    runs(gather(copies.get(), host_pool.p, device_pool.get(), to_device));
    // A copy list in pinned memory is documented as fine.
    runs(gather(static_cast<const kvsift::page_copy*>(pinned_list.p), host_pool.p,
                device_pool.get(), to_device));
    refused([&] { gather(list.data(), host_pool.p, device_pool.get(), to_device)(nullptr); },
            "pageable host memory", "copy list");
    refused([&] { gather(copies.get(), pageable.data(), device_pool.get(), to_device)(nullptr); },
            "pageable host memory", "host pool");
    refused([&] { gather(copies.get(), host_pool.p, host_pool.p, to_device)(nullptr); },
            "host pointer", "device pool");
    foreign_device_cases(gather(copies.get(), host_pool.p, device_pool.get(), to_device));
  }
}

TEST_CASE("bucketed_lru_step_checks_devices", "[cuda][device_checks]") {
  constexpr std::uint32_t capacity = 4, pages = 8;
  device_buffer<std::uint32_t> keys(capacity), slot_of(pages);
  device_buffer<std::uint8_t> ages(capacity);
  KVSIFT_CUDA_CHECK(cudaMemset(keys.get(), 0xFF, capacity * 4));
  KVSIFT_CUDA_CHECK(cudaMemset(slot_of.get(), 0xFF, pages * 4));
  KVSIFT_CUDA_CHECK(cudaMemset(ages.get(), 0, capacity));
  device_buffer<std::uint32_t> selected(std::vector<std::uint32_t>{1, 2});
  device_buffer<std::uint64_t> offsets(std::vector<std::uint64_t>{0, 2});
  device_buffer<std::uint32_t> ev_keys(capacity), ev_slots(capacity), ad_keys(2), ad_slots(2),
      counts(3);
  device_buffer<int> status(1);
  pinned_bytes pinned_limit(sizeof(std::uint32_t));
  *static_cast<std::uint32_t*>(pinned_limit.p) = capacity;
  std::vector<std::uint32_t> host_selected{1, 2};
  std::uint32_t pageable_limit = capacity;
  const auto step = [&](std::uint32_t* k, const std::uint32_t* sel, const std::uint32_t* limits) {
    return [=, &ages, &slot_of, &offsets, &ev_keys, &ev_slots, &ad_keys, &ad_slots, &counts,
            &status](cudaStream_t s) {
      kvsift::cuda::bucketed_lru_ref st{k, ages.get(), slot_of.get(), 1, capacity, pages, limits};
      const kvsift::cuda::lru_step_io io{
          sel,          offsets.get(), ev_keys.get(), ev_slots.get(), ad_keys.get(), ad_slots.get(),
          counts.get(), status.get(),  capacity};
      kvsift::cuda::bucketed_lru_step(st, io, 4, s);
    };
  };
  runs(step(keys.get(), selected.get(), nullptr));
  // Limits in pinned memory are documented as fine.
  runs(step(keys.get(), selected.get(), static_cast<const std::uint32_t*>(pinned_limit.p)));
  std::vector<std::uint32_t> host_keys(capacity);
  refused([&] { step(host_keys.data(), selected.get(), nullptr)(nullptr); }, "host pointer",
          "keys");
  refused([&] { step(keys.get(), host_selected.data(), nullptr)(nullptr); }, "host pointer",
          "selected");
  refused([&] { step(keys.get(), selected.get(), &pageable_limit)(nullptr); },
          "pageable host memory", "limits");
  foreign_device_cases(step(keys.get(), selected.get(), nullptr));
}
