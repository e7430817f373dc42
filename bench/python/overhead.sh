#!/usr/bin/env bash
# The overhead of the Python front (issue 35, "Must show"): `model.latent_codes` on 51,200 SRAVEN
# problems against `hyperlens probe` on the same problem file, interleaved (CLI, Python, CLI, ...),
# wall time, CPU time (user + system) and peak memory (max RSS) of each whole process from
# /usr/bin/time -v.
#   bash bench/python/overhead.sh [ROUNDS] [PYTHON]
# PYTHON is an interpreter with the package installed (`pip install .`); the binary is
# target/release/hyperlens (or $HYPERLENS_BIN). Prints one line per run and the medians' ratios.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
rounds="${1:-3}"
python="${2:-python3}"
bin="${HYPERLENS_BIN:-target/release/hyperlens}"
ckpt=data/checkpoints/sraven-hyla
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$bin" tasks sample --split paper-seed0 --set ood --n 51200 --seed 0 --out "$tmp/p.npz" > /dev/null
cat > "$tmp/py.py" <<PY
import sys, time
import hyperlens as hl
ps = hl.ProblemSet.load(sys.argv[1])
model = hl.load("$ckpt")
t0 = time.perf_counter()
codes = model.latent_codes(ps, site="paper", batch=256)
dt = time.perf_counter() - t0
print(f"latent_codes {codes.codes.shape} in {dt:.2f} s; answer-slot accuracy {100 * codes.accuracy:.2f} %")
PY
measure() {  # label, command...: prints label, wall seconds, CPU seconds (user + system), max RSS MiB
  local label="$1"; shift
  /usr/bin/time -v "$@" > "$tmp/out" 2> "$tmp/time"
  local wall cpu rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, a, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + a[i]; print s}' "$tmp/time")
  cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {print s}' "$tmp/time")
  rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$tmp/time")
  echo "$label wall ${wall} s, CPU ${cpu} s, max RSS ${rss} MiB ($(tail -n 1 "$tmp/out"))"
  echo "$label $wall $cpu $rss" >> "$tmp/all"
}
for r in $(seq 1 "$rounds"); do
  measure cli "$bin" probe --checkpoint "$ckpt" --problems "$tmp/p.npz" --out "$tmp/c.npz" --batch 256
  measure python "$python" "$tmp/py.py" "$tmp/p.npz"
done
"$python" - "$tmp/all" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda who, i: statistics.median(float(r[i]) for r in rows if r[0] == who)
rss = lambda who: max(int(r[3]) for r in rows if r[0] == who)
print(f"median wall: cli {med('cli', 1):.2f} s, python {med('python', 1):.2f} s, ratio python / cli {med('python', 1) / med('cli', 1):.3f}; "
      f"median CPU: cli {med('cli', 2):.2f} s, python {med('python', 2):.2f} s, ratio {med('python', 2) / med('cli', 2):.3f}; "
      f"max RSS: cli {rss('cli')} MiB, python {rss('python')} MiB")
PY
