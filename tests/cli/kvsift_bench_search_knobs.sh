#!/bin/bash
# kvsift-bench's per-call search knobs change what the graph search does, on the real sample:
#   --degree-cap 8     scores fewer keys than the uncapped search at the same pool;
#   --entry-window 4   seeds with the first and last 4 keys: the sink is the top-1 of most of
#                      these queries, so the search starts next to the answer and finds more of
#                      the top-10 (deterministic: the same graph is built for every run);
#   --expand-limits 1,0.5 at --L 20: a row per fraction, the limited one (E = 10, in its label
#                      and as a number in the JSON) scoring fewer keys than the plain pool.
# Usage: kvsift_bench_search_knobs.sh KVSIFT_BENCH SAMPLE_DIR
set -euo pipefail
bench=$1
sample=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  "$bench" --keys "$sample/L15_k0.fbin" --queries "$sample/L15_q0.fbin" --train-fraction 0.95 \
    --k 10 --L 10 --query topk --threads 2 --save-index "$tmp/g" "$@" > /dev/null
}
run --json "$tmp/plain.json"
run --json "$tmp/cap.json" --degree-cap 8
run --json "$tmp/win.json" --entry-window 4
"$bench" --keys "$sample/L15_k0.fbin" --queries "$sample/L15_q0.fbin" --train-fraction 0.95 \
  --k 10 --L 20 --expand-limits 1,0.5 --query topk --threads 2 --load-index "$tmp/g" \
  --json "$tmp/exp.json" > /dev/null
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def row(name):
    js = json.load(open(f"{d}/{name}.json"))
    (r,) = [r for r in js["rows"] if r["index"] == "roargraph"]
    return r["recall"], r["scanned"]
plain, cap, win = row("plain"), row("cap"), row("win")
print("recall / scanned: plain", plain, "cap 8", cap, "window 4", win)
ok = cap[1] < plain[1] and win[0] > plain[0]
exp = {r["param"]: r for r in json.load(open(f"{d}/exp.json"))["rows"] if r["index"] == "roargraph"}
print("expand limits:", {p: (r["params"], r["recall"], r["scanned"]) for p, r in exp.items()})
ok = ok and set(exp) == {"L=20", "L=20,E=10"}
ok = ok and exp["L=20,E=10"]["params"] == {"k": 10, "L": 20, "E": 10}
ok = ok and exp["L=20,E=10"]["scanned"] < exp["L=20"]["scanned"]
sys.exit(0 if ok else 1)
PY
