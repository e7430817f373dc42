#!/usr/bin/env bash
# Interleaved timing of two hyperlens binaries on one machine (A = the base, B = the new build): per
# round, for A then B, the extraction of 51,200 unpermuted OOD codes of sraven-hyla and sraven-softmax,
# then the default report. Prints one line per run ("round R WHO WHAT SECONDS"), the ratios of the
# summed times A / B (above 1: B is faster), and checks that both builds wrote the same codes and
# reports (timings.json aside).
#
# Usage, in the repository root: bash bench/ab.sh A_BINARY B_BINARY [ROUNDS=3]
# The base binary comes from a worktree of the base commit, e.g.
#   git worktree add /tmp/base 2e1a6b4 && (cd /tmp/base && cargo build --release -p hyperlens)
set -euo pipefail
A=$1; B=$2; R=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
t() { local s; s=$(date +%s.%N); "$@" > /dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc; }
declare -A sum
for r in $(seq "$R"); do
  for who in A B; do
    bin=${!who}
    for ck in sraven-hyla sraven-softmax; do
      s=$(t "$bin" probe --checkpoint "data/checkpoints/$ck" --split paper-seed0 --set ood --n 51200 \
        --unpermuted --out "$out/$who-$ck.npz")
      echo "round $r $who probe-$ck $s"
      sum[$who-probe]=$(echo "${sum[$who-probe]:-0} + $s" | bc)
    done
    # Both builds write to the same path (the report records it), then the output is kept aside.
    rm -rf "$out/report"
    s=$(t "$bin" report --out "$out/report")
    rm -rf "$out/report-$who" && mv "$out/report" "$out/report-$who"
    echo "round $r $who report $s"
    sum[$who-report]=$(echo "${sum[$who-report]:-0} + $s" | bc)
  done
done
for what in probe report; do
  echo "ratio A/B $what: $(echo "scale=3; ${sum[A-$what]} / ${sum[B-$what]}" | bc) (A ${sum[A-$what]} s, B ${sum[B-$what]} s)"
done
for ck in sraven-hyla sraven-softmax; do
  cmp -s "$out/A-$ck.npz" "$out/B-$ck.npz" && echo "codes $ck: identical" || echo "codes $ck: DIFFER"
done
diff -rq -x timings.json "$out/report-A" "$out/report-B" && echo "reports: identical" || true
