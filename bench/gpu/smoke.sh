# call 1: CUDA test, then throughput of the base model (batch 128) alone and three at once
source .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; free -g | head -2
(cd /work/main/crates/model && /tmp/mt cuda_forward --nocapture --test-threads 1) 2>&1 | tee $OUT/cuda-test.log
tr() { /tmp/hl train --task sraven --split paper-seed0 --seed 0 --batch 128 --device cuda --eval-every 100000 --eval-n 512 --log-every 100 --checkpoint-every 100000 "$@"; }
for m in softmax hyla; do
  tr --mixer $m --steps 600 --out /tmp/solo-$m > /tmp/solo-$m.log 2>&1
  echo "== solo $m"; tail -3 /tmp/solo-$m/metrics.csv; grep -o '"steps_per_s":[0-9.]*' /tmp/solo-$m/train.json
done
for m in softmax linear hyla; do tr --mixer $m --steps 600 --out /tmp/trio-$m > /tmp/trio-$m.log 2>&1 & done; wait
for m in softmax linear hyla; do echo "== trio $m"; grep -o '"steps_per_s":[0-9.]*' /tmp/trio-$m/train.json; tail -1 /tmp/trio-$m.log; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
