#!/usr/bin/env bash
# kvsift-bench's interchange formats and their errors, one per CTest test:
# `kvsift_bench_formats.sh BENCH MAKE_HDF5 CASE` (MAKE_HDF5: tests/cli/make_ann_hdf5, or "-" for
# a build without HDF5). Each case asserts on figures (recall, QPS, sizes), exit statuses and
# messages, not on row labels.
set -uo pipefail

bench="$1"
make_hdf5="$2"
case_name="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=0
fail() {
  echo "FAIL [$case_name]: $*" >&2
  failed=1
}

# run ARGS...: the bench must succeed; stdout in $work/out.
run() {
  if ! "$bench" "$@" >"$work/out" 2>"$work/err"; then
    fail "exit $? for: $* -- $(cat "$work/err")"
  fi
  cat "$work/out"
}

# expect STATUS REGEX ARGS...: exit status and a stderr match (extended grep).
expect() {
  local want_status="$1" regex="$2"
  shift 2
  "$bench" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  ((status == want_status)) || fail "expected exit status $want_status, got $status for: $*"
  grep -Eq -- "$regex" "$work/err" || fail "stderr does not match /$regex/ for: $*"
  echo "--- $* -> exit $status"
  cat "$work/err"
}

# recall INDEX QUERY PARAM: the recall figure of that table row of $work/out (empty if absent).
recall() {
  awk -v i="$1" -v q="$2" -v p="$3" '$1 == i && $2 == q && $3 == p { print $4 }' "$work/out"
}

# at_least X MIN WHAT: X is a number >= MIN.
at_least() {
  if [[ -z "$1" ]] || ! awk -v x="$1" -v m="$2" 'BEGIN { exit !(x + 0 >= m + 0) }'; then
    fail "$3: expected >= $2, got '${1}'"
  fi
}
at_most() {
  if [[ -z "$1" ]] || ! awk -v x="$1" -v m="$2" 'BEGIN { exit !(x + 0 <= m + 0) }'; then
    fail "$3: expected <= $2, got '${1}'"
  fi
}

demo=(--demo --n 3000 --dim 16 --eval 40 --threads 2)

case "$case_name" in
  hdf5_euclidean)
    "$make_hdf5" "$work/e.hdf5" euclidean 20 || fail "make_ann_hdf5"
    # Half of test trains the graph, the other half is evaluated against rows 25..49 of
    # neighbors: flat must match the file exactly (a misaligned or recomputed-by-ip ground truth
    # cannot), the graph must route.
    run --hdf5 "$work/e.hdf5" --train-fraction 0.5 --index flat,roargraph --k 10 --L 10,40
    grep -q "metric l2" "$work/out" || fail "euclidean must map to --metric l2"
    grep -q "ground truth: --hdf5 neighbors, 20 ids per query" "$work/out" ||
      fail "the file's neighbors were not used"
    at_least "$(recall flat top-10 -)" 1 "flat recall against the file's neighbors"
    at_least "$(recall roargraph top-10 L=40)" 0.9 "roargraph recall at L=40"
    ;;
  hdf5_angular)
    # Variable-length attribute, as h5py writes it; keys of unequal norms, so only normalised
    # vectors rank as the file's cosine neighbours.
    "$make_hdf5" "$work/a.hdf5" angular 10 vlen || fail "make_ann_hdf5"
    run --hdf5 "$work/a.hdf5" --index flat --k 10
    grep -q "metric ip" "$work/out" || fail "angular must map to --metric ip"
    at_least "$(recall flat top-10 -)" 1 "flat recall against cosine neighbours"
    ;;
  hdf5_errors)
    "$make_hdf5" "$work/h.hdf5" hamming 10 || fail "make_ann_hdf5"
    expect 1 "--hdf5 '.*h.hdf5': expected distance euclidean or angular, got 'hamming'" \
      --hdf5 "$work/h.hdf5" --index flat --k 10
    "$make_hdf5" "$work/s.hdf5" euclidean 5 || fail "make_ann_hdf5"
    expect 1 "neighbors: expected 50 rows \(evaluation queries\) x at least 10 columns \(max --k\), got 50 x 5" \
      --hdf5 "$work/s.hdf5" --index flat --k 10
    expect 1 "--hdf5 '.*missing.hdf5': cannot open" --hdf5 "$work/missing.hdf5" --index flat
    expect 2 "--hdf5: the file holds the keys, queries and ground truth" \
      --hdf5 "$work/s.hdf5" --keys "$work/s.hdf5"
    expect 2 "--hdf5: the file's ground truth lists the best K ids only: DIPR" \
      --hdf5 "$work/s.hdf5" --query both
    expect 2 "--metric: --hdf5 takes the metric from the file" --hdf5 "$work/s.hdf5" --metric ip
    expect 2 "--hdf5: the file's ground truth is unfiltered" --hdf5 "$work/s.hdf5" --filter-prefix 9
    # Broken files, each refused with what was expected and what was found.
    "$make_hdf5" "$work/b.hdf5" euclidean 10 bad-id || fail "make_ann_hdf5"
    expect 1 "neighbors: expected ids in \[0, 2000\) \(the train rows\), got 2000 at entry 0" \
      --hdf5 "$work/b.hdf5" --index flat --k 10
    "$make_hdf5" "$work/b.hdf5" euclidean 10 bad-dim || fail "make_ann_hdf5"
    expect 1 "expected test of dimension 16 \(as train\), got 15" --hdf5 "$work/b.hdf5" --index flat
    "$make_hdf5" "$work/b.hdf5" euclidean 10 no-attr || fail "make_ann_hdf5"
    expect 1 "attribute 'distance': missing \(euclidean or angular expected\)" \
      --hdf5 "$work/b.hdf5" --index flat
    "$make_hdf5" "$work/b.hdf5" euclidean 10 no-neighbors || fail "make_ann_hdf5"
    expect 1 "dataset 'neighbors': missing" --hdf5 "$work/b.hdf5" --index flat
    "$make_hdf5" "$work/b.hdf5" euclidean 10 bad-distances || fail "make_ann_hdf5"
    expect 1 "expected distances of 50 x 10 \(as neighbors\), got 50 x 9" \
      --hdf5 "$work/b.hdf5" --index flat
    ;;
  hdf5_unavailable)
    expect 2 "--hdf5: this kvsift-bench was built without HDF5" --hdf5 "$work/x.hdf5"
    ;;
  gt)
    # The file is used as given, not recomputed: ground truth of another workload (same sizes,
    # other vectors: dimension 8) must lose recall, the run's own (written by --save-gt) must
    # give flat exactly 1.
    run "${demo[@]}" --index flat --k 10 --save-gt "$work/own.gt" >/dev/null
    run "${demo[@]}" --dim 8 --index flat --k 10 --save-gt "$work/other.gt" >/dev/null
    run "${demo[@]}" --index flat --k 10 --gt "$work/own.gt"
    grep -q "ground truth: --gt .*own.gt, 10 ids per query" "$work/out" || fail "--gt not used"
    at_least "$(recall flat top-10 -)" 1 "flat recall against its own --save-gt"
    run "${demo[@]}" --index flat --k 10 --gt "$work/other.gt"
    at_most "$(recall flat top-10 -)" 0.5 "flat recall against another workload's ground truth"
    ;;
  gt_errors)
    run "${demo[@]}" --index flat --k 10 --eval 30 --save-gt "$work/30.gt" >/dev/null
    run "${demo[@]}" --index flat --k 5 --save-gt "$work/k5.gt" >/dev/null
    expect 1 "--gt '.*30.gt': expected 40 rows \(evaluation queries\) x at least 10 columns \(max --k\), got 30 x 10" \
      "${demo[@]}" --index flat --k 10 --gt "$work/30.gt"
    expect 1 "--gt '.*k5.gt': expected 40 rows \(evaluation queries\) x at least 10 columns \(max --k\), got 40 x 5" \
      "${demo[@]}" --index flat --k 10 --gt "$work/k5.gt"
    head -c 100 "$work/k5.gt" >"$work/cut.gt"
    expect 1 "--gt '.*cut.gt': expected 808 bytes \(ids\) or 1608 bytes \(ids and distances\) for 40 x 5, got 100 bytes" \
      "${demo[@]}" --index flat --k 5 --gt "$work/cut.gt"
    expect 2 "--gt: the file's ground truth lists the best K ids only: DIPR needs every key's score" \
      "${demo[@]}" --gt "$work/k5.gt" --query dipr
    expect 2 "--gt: the file's ground truth is unfiltered" "${demo[@]}" --query topk \
      --gt "$work/k5.gt" --filter-prefix 100
    # Ids of a 3000-key workload against 1000 keys (demo keys rank the higher ids high).
    expect 1 "--gt '.*k5.gt': expected ids < 1000 \(the keys\), got [0-9]+ at entry [0-9]+" \
      "${demo[@]}" --n 1000 --index flat --k 5 --gt "$work/k5.gt"
    expect 1 "--gt '.*nothing.gt': cannot open" "${demo[@]}" --index flat --k 5 \
      --gt "$work/nothing.gt"
    ;;
  L_sweep)
    expect 2 "--L: expected every L >= the smallest --k, got L=5 < k=10" "${demo[@]}" --k 10 --L 5,20
    # An L serving some k only: the others say so (no silent drop).
    run "${demo[@]}" --query topk --k 10,50 --L 20,50
    grep -q "L sweep: top-50 skips L=20 (L < k)" "$work/out" || fail "skipped pools not reported"
    # The default sweep starts at L = k = 10.
    run "${demo[@]}" --query topk --k 10
    at_least "$(recall roargraph top-10 L=10)" 0.3 "default sweep's first row, L=10"
    [[ -z "$(recall roargraph top-10 L=5)" ]] || fail "a pool below k in the default sweep"
    ;;
  json_fields)
    run "${demo[@]}" --k 10 --L 20,40 --l0 50 --json "$work/r.json" >/dev/null
    python3 - "$work/r.json" "${KVSIFT_EXPECTED_VERSION:-}" <<'PY' || fail "JSON fields"
import json, re, sys
j = json.load(open(sys.argv[1]))
def check(cond, what):
    if not cond:
        print(f"JSON: {what}", file=sys.stderr)
        sys.exit(1)
check(j["kvsift_version"] == sys.argv[2], f"kvsift_version {j['kvsift_version']!r}, expected {sys.argv[2]!r}")
check(re.fullmatch(r"[0-9a-f]{40}|unknown", j["git_commit"]), f"git_commit {j['git_commit']!r}")
check(j["cpu_model"] and j["cpu_model"] != "", "cpu_model empty")
check(j["threads"] == 2, f"threads {j['threads']}")
rg = j["indexes"]["roargraph"]
check(rg["build_seconds"] > 0 and rg["index_bytes"] >= 3000 * 4, f"roargraph build {rg}")
rows = {(r["index"], r["query"], r["param"]): r for r in j["rows"]}
r = rows[("roargraph", "top-10", "L=40")]
check(r["params"] == {"k": 10, "L": 40}, f"params {r['params']}")
check(isinstance(r["params"]["L"], int), "L not a number")
check(r["batch_qps"] > 0 and r["batch_threads"] == 2, f"batch {r['batch_qps']} {r['batch_threads']}")
check(r["build_seconds"] == rg["build_seconds"] and r["index_bytes"] == rg["index_bytes"], "row build")
check(r["mean_us"] > 0 and 0 < r["recall"] <= 1, "latency / recall")
d = rows[("roargraph", "dipr", "l0=50")]
check(d["params"] == {"l0": 50} and d["batch_qps"] > 0, f"dipr row {d}")
f = [r for r in j["rows"] if r["index"] == "flat" and r["query"] == "dipr"][0]
check(isinstance(f["params"]["beta"], float) and f["params"]["beta"] > 0, f"flat beta {f['params']}")
print("JSON OK:", j["kvsift_version"], j["git_commit"], j["cpu_model"], r["batch_qps"])
PY
    ;;
  insert_json)
    # --insert-fraction: the inserted indexes' build records carry the keys inserted and the
    # mean time per key; the peers' too when this kvsift-bench has them.
    indexes=roargraph,hnsw,ivf
    if ! "$bench" "${demo[@]}" --index hnsw,ivf --k 10 --ef 10 --nprobe 1 >/dev/null 2>&1; then
      indexes=roargraph
    fi
    run "${demo[@]}" --index "$indexes" --k 10 --L 20 --ef 20 --nprobe 4 --insert-fraction 0.2 \
      --json "$work/r.json" >/dev/null
    python3 - "$work/r.json" "$indexes" <<'PY' || fail "insert JSON fields"
import json, sys
j = json.load(open(sys.argv[1]))
idx = j["indexes"]
names = {"roargraph": "roargraph+insert", "hnsw": "hnsw+insert", "ivf": "ivf+insert"}
for base in sys.argv[2].split(","):
    rec = idx[names[base]]
    if rec.get("inserted") != 600 or not rec.get("insert_us_per_key", 0) > 0:
        sys.exit(f"JSON: {names[base]} {rec}: expected 600 keys inserted and a time per key")
    if rec["build_seconds"] < rec["insert_us_per_key"] * 600 * 1e-6:
        sys.exit(f"JSON: {names[base]} build_seconds {rec['build_seconds']} excludes the inserts")
    if "inserted" in idx[base]:
        sys.exit(f"JSON: {base} {idx[base]} was built whole, nothing inserted")
    if not any(r["index"] == names[base] for r in j["rows"]):
        sys.exit(f"JSON: no row of {names[base]}")
print("insert JSON OK:", sys.argv[2])
PY
    ;;
  *)
    fail "unknown case"
    ;;
esac
exit "$failed"
