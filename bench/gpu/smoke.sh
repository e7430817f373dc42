# call 1: the CPU-vs-CUDA test (when packed with `pack.sh test`), then the base model's training
# throughput (batch 128): each mixer alone, three at once, and three at once under MPS (mps.sh)
source .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; free -g | head -2
if [ -x /tmp/mt ]; then
  (cd /work/main/crates/model && CARGO_MANIFEST_DIR=$PWD /tmp/mt cuda_forward --nocapture --test-threads 1) 2>&1 | tee $OUT/cuda-test.log
fi
[ -x /tmp/hl ] || exit 0
tr() { /tmp/hl train --task sraven --split paper-seed0 --seed 0 --batch 128 --device cuda --eval-every 100000 --eval-n 512 --log-every 100 --checkpoint-every 100000 "$@"; }
rate() { grep -o '"steps_per_s":[0-9.]*' "$1/train.json"; }
for m in softmax hyla; do
  tr --mixer $m --steps ${SMOKE_STEPS:-600} --out /tmp/solo-$m > /tmp/solo-$m.log 2>&1
  echo "== solo $m $(rate /tmp/solo-$m)"; tail -1 /tmp/solo-$m/metrics.csv
done
trio() {
  for m in softmax linear hyla; do tr --mixer $m --steps ${SMOKE_STEPS:-600} --out /tmp/$1-$m > /tmp/$1-$m.log 2>&1 & done; wait
  for m in softmax linear hyla; do echo "== $1 $m $(rate /tmp/$1-$m)"; tail -1 /tmp/$1-$m.log; done
}
trio trio
source .gpu/mps.sh
if mps_start; then trio mps; mps_stop; fi
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
