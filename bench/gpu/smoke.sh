# the base model's training throughput (batch 128, a `pack.sh train` folder), one run at a time:
# SMOKE lists the runs (default: softmax hyla hyla-events hyla-cache): softmax alone, HYLA alone
# without the upload cache (HYPERLENS_CUDA_UPLOAD_CACHE=0), HYLA with cudarc's per-allocation CUDA
# events kept (HYPERLENS_CUDA_EVENT_TRACKING=1), HYLA with the upload cache (=1, the default since
# 2026-11-23; pick-cache.sh compares it with `hyla`). Otherwise every run inherits the caller's
# HYPERLENS_* variables. MPS_TRIO=1 adds three at once under MPS (mps.sh),
# TRIO=1 three at once without MPS (17-22 steps/s each in November 2026).
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; free -g | head -2
[ -x /tmp/hl ] || exit 0
t() { /tmp/hl train --task sraven --split paper-seed0 --seed 0 --batch 128 --device cuda --eval-every 100000 --eval-n 512 --log-every 100 --checkpoint-every 100000 "$@"; }
rate() { grep -o '"steps_per_s": *[0-9.]*' "$1/train.json"; }
for r in ${SMOKE:-softmax hyla hyla-events hyla-cache}; do
  case $r in
    softmax) t --mixer $r --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-$r > /tmp/solo-$r.log 2>&1 ;;
    hyla) HYPERLENS_CUDA_UPLOAD_CACHE=0 t --mixer hyla --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-$r > /tmp/solo-$r.log 2>&1 ;;
    hyla-events) HYPERLENS_CUDA_EVENT_TRACKING=1 t --mixer hyla --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-$r > /tmp/solo-$r.log 2>&1 ;;
    hyla-cache) HYPERLENS_CUDA_UPLOAD_CACHE=1 t --mixer hyla --steps ${SMOKE_STEPS:-1000} --out /tmp/solo-$r > /tmp/solo-$r.log 2>&1 ;;
    *) echo "unknown smoke run $r"; continue ;;
  esac
  echo "== solo $r $(rate /tmp/solo-$r)"; tail -1 /tmp/solo-$r/metrics.csv
done
trio() {
  for m in softmax linear hyla; do t --mixer $m --steps ${SMOKE_STEPS:-1000} --out /tmp/$1-$m > /tmp/$1-$m.log 2>&1 & done; wait
  for m in softmax linear hyla; do echo "== $1 $m $(rate /tmp/$1-$m)"; tail -1 /tmp/$1-$m.log; done
}
[ "${TRIO:-0}" = 1 ] && trio trio
if [ "${MPS_TRIO:-0}" = 1 ]; then
  source "$G/mps.sh"
  if mps_start; then trio mps; mps_stop; fi
fi
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
