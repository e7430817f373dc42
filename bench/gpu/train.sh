# starts the base-model runs (MIXERS, default softmax linear hyla) detached, then report progress
# until about $WAIT seconds have passed (wait.sh). Fresh runs: STEPS, EVAL_EVERY (also the checkpoint
# interval). RESUME=1: continue data/checkpoints/sraven-<mixer> of the carried tree (`--resume`, same
# schedule); with KEEP=1 as well, continue /tmp/runs/sraven-<mixer> of this machine instead (after
# stop.sh, e.g. to change a HYPERLENS_* switch). MPS=1: under an MPS daemon (mps.sh), so that the runs
# share the GPU at once.
# The mixer list is kept in /tmp/runs/MIXERS for wait.sh and snapshot.sh of later calls.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
if [ "${MPS:-0}" = 1 ]; then source "$G/mps.sh"; mps_start; fi
mkdir -p /tmp/runs
export MIXERS=${MIXERS:-softmax linear hyla}
echo "$MIXERS" > /tmp/runs/MIXERS
for m in $MIXERS; do
  if [ "${RESUME:-0}" = 1 ]; then
    if [ "${KEEP:-0}" != 1 ]; then rm -rf /tmp/runs/sraven-$m; cp -a data/checkpoints/sraven-$m /tmp/runs/; fi
    args=(--resume)
  else
    args=(--task sraven --mixer $m --split paper-seed0 --seed 0 --batch 128 --steps $STEPS
      --eval-every $EVAL_EVERY --eval-n 2048 --checkpoint-every $EVAL_EVERY --log-every 500)
  fi
  setsid nohup /tmp/hl train "${args[@]}" --device cuda --out /tmp/runs/sraven-$m \
    > /tmp/runs/sraven-$m.log 2>&1 < /dev/null &
done
sleep 5; ps aux | grep -c "[h]l train"
source "$G/wait.sh"
