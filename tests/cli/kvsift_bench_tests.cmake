# Smoke tests of the kvsift-bench CLI, registered with CTest. Included from bench/CMakeLists.txt
# right after the kvsift-bench target is defined (it needs that scope's peer detection:
# KVSIFT_BENCH_PEERS, KVSIFT_HNSWLIB_INCLUDE_DIR, faiss_FOUND). Test names are part of CI's
# interface: keep them stable.

# The CLI end to end on a small synthetic workload, and its refusal of a bad option.
add_test(NAME kvsift_bench_demo
         COMMAND kvsift-bench --demo --n 3000 --eval 40 --L 100,200 --l0 50,100)
set_tests_properties(kvsift_bench_demo PROPERTIES PASS_REGULAR_EXPRESSION
                                                  "roargraph +dipr +l0=100")
# Real Q/K from SmolLM2-135M (bench/data/sample, committed): layer 15, query head 0 over
# KV head 0, the first 95% of positions train the index, the last 5% are evaluated.
add_test(NAME kvsift_bench_real_sample
         COMMAND kvsift-bench --keys "${PROJECT_SOURCE_DIR}/bench/data/sample/L15_k0.fbin"
                 --queries "${PROJECT_SOURCE_DIR}/bench/data/sample/L15_q0.fbin"
                 --train-fraction 0.95 --k 10 --L 50,100 --query both --l0 50)
set_tests_properties(kvsift_bench_real_sample PROPERTIES PASS_REGULAR_EXPRESSION
                                                         "roargraph +top-10 +L=100")
# --insert-fraction: an index built on 80% of the keys receives the rest one by one; the
# insert line must report a time per key and the inserted index its recall rows.
add_test(NAME kvsift_bench_insert_fraction
         COMMAND kvsift-bench --demo --n 3000 --dim 32 --eval 40 --k 10 --L 40 --query topk
                 --insert-fraction 0.2 --threads 2)
set_tests_properties(kvsift_bench_insert_fraction PROPERTIES PASS_REGULAR_EXPRESSION
                     "inserted 600 keys one by one: mean [0-9.e+]+ us/key.*scored per insert: <= 512 .*roargraph\\+insert +top-10 +L=40 +(1\\.0000|0\\.[6-9])")
# --insert-query-stride: the queries of the inserted positions join the training queries
# (add_queries) on the real sample: 461 inserted positions below the 95% split, every 4th.
add_test(NAME kvsift_bench_insert_query_stride
         COMMAND kvsift-bench --keys "${PROJECT_SOURCE_DIR}/bench/data/sample/L15_k0.fbin"
                 --queries "${PROJECT_SOURCE_DIR}/bench/data/sample/L15_q0.fbin"
                 --train-fraction 0.95 --k 10 --L 40 --query topk --insert-fraction 0.2
                 --insert-query-stride 4 --threads 2)
set_tests_properties(kvsift_bench_insert_query_stride PROPERTIES PASS_REGULAR_EXPRESSION
                     "decode queries added: 116 \\(every 4 positions, mean [0-9.e+]+ us per query.*roargraph\\+insert +top-10 +L=40")
add_test(NAME kvsift_bench_rejects_query_stride_without_positions
         COMMAND kvsift-bench --demo --n 3000 --insert-fraction 0.2 --insert-query-stride 4)
set_tests_properties(kvsift_bench_rejects_query_stride_without_positions PROPERTIES
                     PASS_REGULAR_EXPRESSION
                     "--insert-query-stride: expected it with --insert-fraction over --keys/--queries")
# --insert-query-lists: the approximate kNN-list upkeep of the inserts, reported on the line.
add_test(NAME kvsift_bench_insert_query_lists
         COMMAND kvsift-bench --demo --n 3000 --dim 32 --eval 40 --k 10 --L 40 --query topk
                 --insert-fraction 0.2 --insert-query-lists 16 --threads 2)
set_tests_properties(kvsift_bench_insert_query_lists PROPERTIES PASS_REGULAR_EXPRESSION
                     "query lists updated per insert: 16.*roargraph\\+insert +top-10 +L=40")
# --insert-query-candidates: the query-side index's cap (0 = scan every query), on the line.
add_test(NAME kvsift_bench_insert_query_candidates
         COMMAND kvsift-bench --demo --n 3000 --dim 32 --eval 40 --k 10 --L 40 --query topk
                 --insert-fraction 0.2 --insert-query-candidates 0 --threads 2)
set_tests_properties(kvsift_bench_insert_query_candidates PROPERTIES PASS_REGULAR_EXPRESSION
                     "training queries scored per insert: all.*roargraph\\+insert +top-10 +L=40")
add_test(NAME kvsift_bench_rejects_query_candidates_without_insert
         COMMAND kvsift-bench --demo --n 3000 --insert-query-candidates 0)
set_tests_properties(kvsift_bench_rejects_query_candidates_without_insert PROPERTIES
                     PASS_REGULAR_EXPRESSION
                     "--insert-query-candidates: expected it with --insert-fraction, got 0 without")
add_test(NAME kvsift_bench_rejects_query_lists_without_insert
         COMMAND kvsift-bench --demo --n 3000 --insert-query-lists 16)
set_tests_properties(kvsift_bench_rejects_query_lists_without_insert PROPERTIES PASS_REGULAR_EXPRESSION
                     "--insert-query-lists: expected it with --insert-fraction, got 16 without")
add_test(NAME kvsift_bench_rejects_expand_limit_out_of_range
         COMMAND kvsift-bench --demo --n 3000 --expand-limits 1,0)
set_tests_properties(kvsift_bench_rejects_expand_limit_out_of_range PROPERTIES
                     PASS_REGULAR_EXPRESSION "--expand-limits: expected fractions in \\(0, 1\\], got '0'")
add_test(NAME kvsift_bench_rejects_unknown_option COMMAND kvsift-bench --demo --frobnicate 1)
set_tests_properties(kvsift_bench_rejects_unknown_option PROPERTIES WILL_FAIL TRUE)
# Bad input, each case checking the exit status AND the message (and the files a --json
# run leaves): tests/cli/kvsift_bench_bad_input.sh CASE.
foreach(case IN ITEMS unknown_option empty_queries plan_short_queries json_full_disk
                      json_unwritable_dir json_atomic strict_numbers)
  add_test(NAME kvsift_bench_bad_input_${case}
           COMMAND bash "${PROJECT_SOURCE_DIR}/tests/cli/kvsift_bench_bad_input.sh"
                   $<TARGET_FILE:kvsift-bench> ${case})
endforeach()
set(kvsift_sample "${PROJECT_SOURCE_DIR}/bench/data/sample")
add_test(NAME kvsift_bench_rejects_mismatched_dims
         COMMAND kvsift-bench --keys "${kvsift_sample}/L15_k0.fbin"
                 --queries "${PROJECT_SOURCE_DIR}/bench/data/testdata/dim32.fbin")
set_tests_properties(kvsift_bench_rejects_mismatched_dims PROPERTIES PASS_REGULAR_EXPRESSION
                     "error: .*dimension vs --keys: expected dimension 64, got 32")
# The per-call search knobs (--degree-cap, --entry-window, --expand-limits) act on the graph
# search.
add_test(NAME kvsift_bench_search_knobs
         COMMAND bash "${PROJECT_SOURCE_DIR}/tests/cli/kvsift_bench_search_knobs.sh"
                 $<TARGET_FILE:kvsift-bench> "${kvsift_sample}")
# Attention quality (causal, window + retrieval vs full attention) on the real sample.
add_test(NAME kvsift_bench_quality_sample
         COMMAND kvsift-bench --keys "${kvsift_sample}/L15_k0.fbin"
                 --queries "${kvsift_sample}/L15_q0.fbin" --values "${kvsift_sample}/L15_v0.fbin"
                 --train-fraction 0.95 --k 10 --L 50 --attn-k 32 --attn-beta 8 --threads 2)
set_tests_properties(kvsift_bench_quality_sample PROPERTIES PASS_REGULAR_EXPRESSION
                     "roargraph dipr +beta=8,l0=100")
if(KVSIFT_BENCH_PEERS AND KVSIFT_HNSWLIB_INCLUDE_DIR AND faiss_FOUND)
  add_test(NAME kvsift_bench_peers_sample
           COMMAND kvsift-bench --keys "${kvsift_sample}/L15_k0.fbin"
                   --queries "${kvsift_sample}/L15_q0.fbin" --train-fraction 0.95
                   --index hnsw,ivf --k 10 --ef 20,50 --nprobe 4,8 --threads 2)
  set_tests_properties(kvsift_bench_peers_sample PROPERTIES PASS_REGULAR_EXPRESSION
                       "hnsw +top-10 +ef=50.*ivf +top-10 +nprobe=8")
  # --insert-fraction with the peers: each built on the first 80% and given the rest by its own
  # insert. The late queries' top-10 are nearly all late keys, so an index that lost its inserts
  # scores near 0 (measured: hnsw+insert 0.0000, ivf+insert 0.0987 with the inserts skipped);
  # IVF probing all of its 64 lists is exact only when every inserted key is in a list.
  add_test(NAME kvsift_bench_peers_insert_sample
           COMMAND kvsift-bench --keys "${kvsift_sample}/L15_k0.fbin"
                   --queries "${kvsift_sample}/L15_q0.fbin" --train-fraction 0.95
                   --index roargraph,hnsw,ivf --k 10 --L 40 --ef 200 --nlist 64 --nprobe 64
                   --insert-fraction 0.2 --threads 2)
  set_tests_properties(kvsift_bench_peers_insert_sample PROPERTIES PASS_REGULAR_EXPRESSION
                       "hnswlib\\+insert: built on 2457 keys in [0-9.e+-]+ s, inserted 615 keys one by one: mean [0-9.e+-]+ us/key.*faiss IVF-Flat\\+insert: built on 2457 keys .*inserted 615 keys.*hnsw\\+insert +top-10 +ef=200 +0\\.[89].*ivf\\+insert +top-10 +nprobe=64 +1\\.0000")
endif()
# Interchange formats (--hdf5, --gt, --json fields, the L sweep) and their errors:
# tests/cli/kvsift_bench_formats.sh BENCH MAKE_HDF5 CASE. The HDF5 files are written at test time
# by make_ann_hdf5 (HDF5 C API), so no binary is committed.
set(kvsift_format_cases gt gt_errors L_sweep json_fields insert_json)
if(HDF5_FOUND)
  add_executable(kvsift-make-ann-hdf5 "${PROJECT_SOURCE_DIR}/tests/cli/make_ann_hdf5.cpp")
  target_include_directories(kvsift-make-ann-hdf5 SYSTEM PRIVATE ${HDF5_C_INCLUDE_DIRS}
                                                                 ${HDF5_INCLUDE_DIRS})
  target_link_libraries(kvsift-make-ann-hdf5 PRIVATE ${HDF5_C_LIBRARIES})
  target_compile_definitions(kvsift-make-ann-hdf5 PRIVATE ${HDF5_C_DEFINITIONS})
  kvsift_project_target(kvsift-make-ann-hdf5)
  set(kvsift_make_hdf5 $<TARGET_FILE:kvsift-make-ann-hdf5>)
  list(APPEND kvsift_format_cases hdf5_euclidean hdf5_angular hdf5_errors)
else()
  set(kvsift_make_hdf5 "-")
  list(APPEND kvsift_format_cases hdf5_unavailable)
endif()
foreach(case IN LISTS kvsift_format_cases)
  add_test(NAME kvsift_bench_formats_${case}
           COMMAND bash "${PROJECT_SOURCE_DIR}/tests/cli/kvsift_bench_formats.sh"
                   $<TARGET_FILE:kvsift-bench> ${kvsift_make_hdf5} ${case})
  set_tests_properties(kvsift_bench_formats_${case} PROPERTIES
                       ENVIRONMENT "KVSIFT_EXPECTED_VERSION=${PROJECT_VERSION}")
endforeach()
