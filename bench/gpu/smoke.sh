# call 1: the CPU-vs-CUDA test (when packed with `pack.sh test`), then the base model's training
# throughput (batch 128): softmax and HYLA alone, HYLA alone with cudarc's events kept and with the
# upload cache (HYPERLENS_CUDA_UPLOAD_CACHE=1); every run inherits the caller's HYPERLENS_* variables.
# MPS_TRIO=1 adds three at once under MPS (mps.sh; the resumed runs of train.sh measure that too),
# TRIO=1 three at once without MPS (17-22 steps/s each in November 2026).
source .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; free -g | head -2
if [ -x /tmp/mt ]; then
  (cd /work/main/crates/model && CARGO_MANIFEST_DIR=$PWD /tmp/mt cuda_forward --nocapture --test-threads 1) 2>&1 | tee $OUT/cuda-test.log
fi
[ -x /tmp/hl ] || exit 0
t() { /tmp/hl train --task sraven --split paper-seed0 --seed 0 --batch 128 --device cuda --eval-every 100000 --eval-n 512 --log-every 100 --checkpoint-every 100000 "$@"; }
rate() { grep -o '"steps_per_s": *[0-9.]*' "$1/train.json"; }
for m in softmax hyla; do
  t --mixer $m --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-$m > /tmp/solo-$m.log 2>&1
  echo "== solo $m $(rate /tmp/solo-$m)"; tail -1 /tmp/solo-$m/metrics.csv
done
# the same HYLA run with cudarc's per-allocation CUDA events kept (as before 2026-11-22 evening)
HYPERLENS_CUDA_EVENT_TRACKING=1 t --mixer hyla --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-hyla-events > /tmp/solo-hyla-events.log 2>&1
echo "== solo hyla, events kept $(rate /tmp/solo-hyla-events)"; tail -1 /tmp/solo-hyla-events/metrics.csv
# and with candle's per-operation uploads cached around the backward pass and the update
HYPERLENS_CUDA_UPLOAD_CACHE=1 t --mixer hyla --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-hyla-cache > /tmp/solo-hyla-cache.log 2>&1
echo "== solo hyla, upload cache $(rate /tmp/solo-hyla-cache)"; tail -1 /tmp/solo-hyla-cache/metrics.csv
trio() {
  for m in softmax linear hyla; do t --mixer $m --steps ${SMOKE_STEPS:-1000} --out /tmp/$1-$m > /tmp/$1-$m.log 2>&1 & done; wait
  for m in softmax linear hyla; do echo "== $1 $m $(rate /tmp/$1-$m)"; tail -1 /tmp/$1-$m.log; done
}
[ "${TRIO:-0}" = 1 ] && trio trio
if [ "${MPS_TRIO:-0}" = 1 ]; then
  source .gpu/mps.sh
  if mps_start; then trio mps; mps_stop; fi
fi
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
