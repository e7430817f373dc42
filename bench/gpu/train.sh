# call 2: start the three base-model runs (detached), then report progress until about $WAIT seconds have passed
source .gpu/setup.sh
mkdir -p /tmp/runs
for m in softmax linear hyla; do
  setsid nohup /tmp/hl train --task sraven --mixer $m --split paper-seed0 --seed 0 --batch 128 --device cuda \
    --steps $STEPS --eval-every $EVAL_EVERY --eval-n 2048 --checkpoint-every $EVAL_EVERY --log-every 500 \
    --out /tmp/runs/sraven-$m > /tmp/runs/sraven-$m.log 2>&1 < /dev/null &
done
sleep 5; ps aux | grep -c "[h]l train"
source .gpu/wait.sh
