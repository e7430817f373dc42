# copy each run directory as soon as its checkpoint reaches step $AT (checkpoints are written every
# --checkpoint-every steps), for at most $WAIT seconds, then pack the copies into $OUT (one tar per run,
# each under the 16 MB limit of what comes back)
MIXERS=${MIXERS:-$(cat /tmp/runs/MIXERS 2>/dev/null || echo softmax linear hyla)}
cd /tmp/runs; mkdir -p /tmp/snap; t0=$(date +%s)
st() { grep -o '"step": *[0-9]*' "sraven-$1/train_state.json" | grep -o '[0-9]*$'; }
while [ $(( $(date +%s) - t0 )) -lt ${WAIT:-480} ]; do
  left=0
  for m in $MIXERS; do
    [ -e /tmp/snap/sraven-$m ] && continue
    if [ "$(st $m)" -ge "$AT" ] 2>/dev/null; then cp -a sraven-$m /tmp/snap/; echo "snapshot $m at step $(st $m)"; else left=1; fi
  done
  [ $left = 0 ] && break
  sleep 3
done
cd /tmp/snap && for d in sraven-*; do tar cf "$OUT/$d.tar" "$d"; done; ls -la "$OUT"
