#!/usr/bin/env bash
# Bad-input cases of kvsift-bench, one per CTest test: `kvsift_bench_bad_input.sh BENCH CASE`.
# Each case checks the exit status AND the message (and, for --json, the files left behind), so
# a crash (status >= 128), a silent exit 0 or a wrong message all fail. Input files are written
# here with printf (tiny .fbin files: uint32 rows, uint32 dim, then little-endian f32 rows).
set -uo pipefail

bench="$1"
case_name="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=0
fail() {
  echo "FAIL [$case_name]: $*" >&2
  failed=1
}

# fbin FILE ROWS DIM: rows x dim floats alternating 1.0 and 2.0 (values are irrelevant here).
fbin() {
  local file="$1" rows="$2" dim="$3"
  le32() { printf "\\x$(printf %02x $(($1 & 255)))\\x$(printf %02x $((($1 >> 8) & 255)))\\x$(printf %02x $((($1 >> 16) & 255)))\\x$(printf %02x $((($1 >> 24) & 255)))"; }
  {
    le32 "$rows"
    le32 "$dim"
    for ((i = 0; i < rows * dim; ++i)); do
      if ((i % 2)); then printf '\x00\x00\x00\x40'; else printf '\x00\x00\x80\x3f'; fi
    done
  } >"$file"
}

# expect STATUS REGEX ARGS...: runs the bench, checks its exit status and that stderr matches
# REGEX (extended grep).
expect() {
  local want_status="$1" regex="$2"
  shift 2
  "$bench" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  if ((status != want_status)); then
    fail "expected exit status $want_status, got $status for: $*"
  fi
  if ! grep -Eq -- "$regex" "$work/err"; then
    fail "stderr does not match /$regex/ for: $*"
  fi
  echo "--- $* -> exit $status"
  cat "$work/err"
}

demo=(--demo --n 400 --dim 8 --eval 5 --k 10 --L 20 --l0 10 --threads 1)

case "$case_name" in
  unknown_option)
    expect 2 "unknown option '--frobnicate'" --demo --frobnicate 1
    expect 2 "--json: --plan runs write no JSON" --plan auto --plan-dump "$work" --json "$work/x"
    # flat-full is a registered pair of kinds, but nothing executes it: refused up front.
    expect 2 "--plan: no executor for plan 'flat-full'; runnable: .*graph-dipr" \
      --plan flat-full --plan-dump "$work"
    ;;
  empty_queries)
    fbin "$work/k.fbin" 8 4
    fbin "$work/q.fbin" 0 4
    expect 1 "no evaluation queries: --queries '.*q.fbin' has 0 rows" \
      --keys "$work/k.fbin" --queries "$work/q.fbin" --index flat
    expect 1 "no evaluation queries" \
      --keys "$work/k.fbin" --queries "$work/q.fbin" --train-fraction 0.5
    ;;
  plan_short_queries)
    mkdir "$work/dump"
    fbin "$work/dump/L0_k0.fbin" 40 4
    fbin "$work/dump/L0_v0.fbin" 40 4
    # 39 rows: enough for the 38 training queries, one short of the held-out query at row 39
    # (the old code read that row past the end of Q). And one far too short.
    fbin "$work/dump/L0_q0.fbin" 39 4
    expect 1 "expected .*L0_q0.fbin of at least 40 rows x 4 .*got 39 x 4" \
      --plan auto --plan-dump "$work/dump"
    fbin "$work/dump/L0_q0.fbin" 3 4
    expect 1 "expected .*L0_q0.fbin of at least 40 rows x 4 .*got 3 x 4" \
      --plan auto --plan-dump "$work/dump"
    fbin "$work/dump/L0_q0.fbin" 40 4
    fbin "$work/dump/L0_v0.fbin" 39 4
    expect 1 "expected .*L0_v0.fbin of 40 x 4 .*got 39 x 4" --plan auto --plan-dump "$work/dump"
    ;;
  json_full_disk)
    # /dev/full accepts open() and fails every write with ENOSPC: the run must not exit 0.
    expect 1 "--json '/dev/full': write failed: No space left on device" "${demo[@]}" \
      --json /dev/full
    ;;
  json_unwritable_dir)
    expect 1 "--json '$work/missing/out.json': cannot create a temporary file in '$work/missing'" \
      "${demo[@]}" --json "$work/missing/out.json"
    # Checked before the run: nothing was measured or printed.
    if [[ -s "$work/out" ]]; then fail "the run started before the --json check"; fi
    ;;
  json_atomic)
    echo OLD >"$work/r.json"
    fbin "$work/k.fbin" 8 4
    fbin "$work/q.fbin" 0 4
    # A failed run leaves the old file and no temporary behind.
    expect 1 "no evaluation queries" --keys "$work/k.fbin" --queries "$work/q.fbin" \
      --json "$work/r.json"
    [[ "$(cat "$work/r.json")" == OLD ]] || fail "a failed run changed the --json file"
    # A successful run replaces it whole.
    "$bench" "${demo[@]}" --json "$work/r.json" >/dev/null 2>"$work/err" ||
      fail "the demo run failed: $(cat "$work/err")"
    grep -q '"rows": \[' "$work/r.json" || fail "no JSON written"
    tail -n 1 "$work/r.json" | grep -qx '}' || fail "JSON not complete"
    leftovers="$(find "$work" -name '.r.json.tmp-*')"
    [[ -z "$leftovers" ]] || fail "temporary files left: $leftovers"
    ;;
  strict_numbers)
    expect 2 "--M: expected a count \(decimal digits only\), got '2\^62'" "${demo[@]}" --M '2^62'
    expect 2 "--M: expected a count in \[0, 4294967295\], got '4611686018427387904'" \
      "${demo[@]}" --M 4611686018427387904
    expect 2 "--L: expected a count in \[0, 4294967295\], got '99999999999999999999999'" \
      "${demo[@]}" --L 99999999999999999999999
    expect 2 "--n: expected a count \(decimal digits only\), got ' 12'" "${demo[@]}" --n ' 12'
    expect 2 "--k: expected a count \(decimal digits only\), got '10abc'" "${demo[@]}" --k 10abc
    expect 2 "--k: expected a count \(decimal digits only\), got '-1'" "${demo[@]}" --k 5,-1
    expect 2 "--n: expected a count \(decimal digits only\), got ''" "${demo[@]}" --n ''
    expect 2 "--beta: expected a finite number, got '1e999'" "${demo[@]}" --beta 1e999
    expect 2 "--beta: expected a finite number, got ' 1'" "${demo[@]}" --beta ' 1'
    expect 2 "--train-fraction: expected a finite number, got '0.5x'" "${demo[@]}" \
      --train-fraction 0.5x
    expect 2 "--demo: expected --n >= 2 and --dim >= 1, got 0 and 8" "${demo[@]}" --n 0
    ;;
  *)
    fail "unknown case"
    ;;
esac
exit "$failed"
