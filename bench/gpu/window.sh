#!/usr/bin/env bash
# One device call of the GPU issue (about 4-5 minutes on an H100/H200): everything it measures goes to
# stdout and to $OUT/window.log, with the files it compares under $OUT.
#   (a) the CPU-vs-CUDA tests (when the test binary is packed: pack.sh window, or pack.sh test): all
#       eight mixers' logits, codes and gradients, and the fused CUDA kernels (the HYLA mix forward
#       and backward, the AdamW update) against the CPU; then the eight mixers again with the fused
#       kernels off (HYPERLENS_FUSED_CUDA=0);
#   (b) training model-steps/s of batched groups (`train --seeds`): HYLA for M = 1 2 4 8 16 32, softmax
#       for M = 1 and 16 (train.json's steps_per_s and model_steps_per_s), with the fused CUDA
#       kernels (opt-in, so the window exports HYPERLENS_FUSED_CUDA=1); then HYLA for M = $FUSED_OFF_MS
#       with them off (HYPERLENS_FUSED_CUDA=0: the composed candle operations, the binary's default);
#   (c) a batched group of 2 against its two single runs on the device: the largest relative difference
#       of the losses (metrics.csv) and of the weights (model.safetensors) after $CHECK_STEPS steps;
#   (d) `probe --n $PROBE_N` on the device and on the machine's CPU, codes compared, problems/s of both;
#   (e) the default report on the device, if the time left allows.
#
# On the lent machine (binaries unpacked by setup.sh from a pack.sh folder):
#   run: command `bash .gpu/window.sh`, carry [".gpu"], timeout_s 420 (pack.sh window: both binaries)
# Dry run on the CPU machine before any device call (small sizes, the local binary):
#   DEVICE=cpu HL=target/release/hyperlens SMALL=1 OUT=/tmp/window bash bench/gpu/window.sh
set -uo pipefail
export HYPERLENS_FUSED_CUDA=1  # the fused CUDA kernels are opt-in (docs/gpu.md); the runs marked =0 turn them off
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}  # with numpy
OUT=${OUT:-/tmp/window}
mkdir -p "$OUT"
G=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${HL:-}" ]; then
  source "$G/setup.sh"
  HL=/tmp/hl
fi
HL=$(readlink -f "$HL")
if [ "${SMALL:-0}" = 1 ]; then
  MS_HYLA=${MS_HYLA:-1 2}; MS_SOFTMAX=${MS_SOFTMAX:-1 2}; RATE_STEPS=${RATE_STEPS:-20}; FUSED_OFF_MS=${FUSED_OFF_MS:-1 2}
  CHECK_STEPS=${CHECK_STEPS:-10}; PROBE_N=${PROBE_N:-512}; BUDGET_S=${BUDGET_S:-120}
else
  MS_HYLA=${MS_HYLA:-1 2 4 8 16 32}; MS_SOFTMAX=${MS_SOFTMAX:-1 16}; RATE_STEPS=${RATE_STEPS:-300}
  FUSED_OFF_MS=${FUSED_OFF_MS:-1 16}
  CHECK_STEPS=${CHECK_STEPS:-200}; PROBE_N=${PROBE_N:-51200}; BUDGET_S=${BUDGET_S:-300}
fi
START=$(date +%s)
W=$(mktemp -d)
log() { echo "$*" | tee -a "$OUT/window.log"; }
elapsed() { echo $(( $(date +%s) - START )); }
seeds() { seq -s, 0 $(( $1 - 1 )); }

log "== window: device $DEVICE, binary $HL ($("$HL" --version 2>&1)), $(date -u +%FT%TZ)"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/window.log"

log "== (a) CPU-vs-CUDA tests: the eight mixers and the fused kernels; then the mixers with the fused kernels off"
if [ -x /tmp/mt ]; then
  (cd /work/main/crates/model && CARGO_MANIFEST_DIR=$PWD timeout 150 /tmp/mt cuda_ --nocapture --test-threads 1) > "$OUT/cuda-test.log" 2>&1
  log "cuda tests exit $?: $(grep -E 'test result' "$OUT/cuda-test.log" | tail -1)"
  grep -E '^(fused|cuda vs cpu)|panicked' "$OUT/cuda-test.log" | tee -a "$OUT/window.log"
  (cd /work/main/crates/model && HYPERLENS_FUSED_CUDA=0 CARGO_MANIFEST_DIR=$PWD timeout 120 /tmp/mt cuda_forward --nocapture --test-threads 1) > "$OUT/cuda-test-unfused.log" 2>&1
  log "cuda test, fused kernels off, exit $?: $(grep -E 'test result' "$OUT/cuda-test-unfused.log" | tail -1)"
else
  log "skipped: no test binary (/tmp/mt; pack it with bench/gpu/pack.sh test)"
fi

log "== (b) training rates: mixer M updates/s model-steps/s (steps $RATE_STEPS, batch 128)"
rate() {  # mixer M [label]: the label names a setting of the environment (HYPERLENS_FUSED_CUDA)
  local dir="$W/rate-$1-$2${3:+-$3}"
  timeout 200 "$HL" train --task sraven --mixer "$1" --seeds "$(seeds "$2")" --steps "$RATE_STEPS" \
    --eval-every 0 --eval-n 256 --checkpoint-every 0 --log-every 50 --device "$DEVICE" --out "$dir" \
    > "$dir.log" 2>&1 || { log "$1 M=$2 ${3:-} failed: $(tail -1 "$dir.log")"; return; }
  "$PY" - "$dir" "$1" "$2" "${3:-fused}" <<'PY' | tee -a "$OUT/window.log"
import json, sys, glob, os
d, mixer, m, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
recs = sorted(glob.glob(os.path.join(d, '**', 'train.json'), recursive=True))
r = json.load(open(recs[0]))
print(f"{mixer} M={m} ({label}): {r['steps_per_s']:.1f} updates/s, {r.get('model_steps_per_s') or r['steps_per_s']:.1f} model-steps/s ({len(recs)} run(s))")
PY
}
for m in $MS_HYLA; do rate hyla "$m"; done
for m in $MS_SOFTMAX; do rate softmax "$m"; done
for m in $FUSED_OFF_MS; do HYPERLENS_FUSED_CUDA=0 rate hyla "$m" composed; done

log "== (c) batched group of 2 against its single runs, $CHECK_STEPS steps on $DEVICE"
common=(--task sraven --mixer hyla --steps "$CHECK_STEPS" --eval-every 0 --eval-n 256 --checkpoint-every 0
  --log-every 10 --device "$DEVICE")
timeout 120 "$HL" train "${common[@]}" --seeds 0,1 --out "$W/group" > "$W/group.log" 2>&1
for s in 0 1; do timeout 120 "$HL" train "${common[@]}" --seed "$s" --out "$W/single-$s" > "$W/single-$s.log" 2>&1; done
"$PY" "$G/window_compare.py" group "$W/group" "$W/single-0" "$W/single-1" | tee -a "$OUT/window.log"

log "== (d) probe --n $PROBE_N: $DEVICE against the CPU"
for dev in "$DEVICE" cpu; do
  t0=$(date +%s.%N)
  timeout 200 "$HL" probe --checkpoint data/checkpoints/sraven-hyla --split paper-seed0 --set ood --n "$PROBE_N" \
    --unpermuted --device "$dev" --out "$W/codes-$dev.npz" > "$W/probe-$dev.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  log "probe on $dev: exit $rc, $("$PY" -c "print(f'{$t1-$t0:.2f} s, {$PROBE_N/($t1-$t0):.0f} problems/s')")"
done
"$PY" "$G/window_compare.py" codes "$W/codes-$DEVICE.npz" "$W/codes-cpu.npz" | tee -a "$OUT/window.log"

if [ "$(elapsed)" -lt "$BUDGET_S" ]; then
  log "== (e) the default report on $DEVICE"
  t0=$(date +%s)
  timeout $(( BUDGET_S + 120 - $(elapsed) )) "$HL" report --device "$DEVICE" --out "$W/report" > "$W/report.log" 2>&1
  log "report on $DEVICE: exit $?, $(( $(date +%s) - t0 )) s"
  cp "$W/report/tables/accuracy.csv" "$OUT/report-accuracy-$DEVICE.csv" 2>/dev/null
else
  log "== (e) skipped: $(elapsed) s used of $BUDGET_S"
fi
log "== window done in $(elapsed) s"
