# report progress every minute until the runs end or about $WAIT seconds have passed; pack what exists
MIXERS=${MIXERS:-$(cat /tmp/runs/MIXERS 2>/dev/null || echo softmax linear hyla)}
t0=$(date +%s)
while pgrep -f "hl train" > /dev/null && [ $(( $(date +%s) - t0 )) -lt ${WAIT:-480} ]; do
  sleep 60
  for m in $MIXERS; do echo "$m: $(tail -1 /tmp/runs/sraven-$m/metrics.csv 2>/dev/null)"; done
done
for m in $MIXERS; do tail -2 /tmp/runs/sraven-$m.log; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
cd /tmp/runs && for m in $MIXERS; do tar cf $OUT/sraven-$m.tar sraven-$m sraven-$m.log; done; ls -la $OUT
