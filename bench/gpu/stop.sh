# stops the training runs of train.sh (their last checkpoint in /tmp/runs stays). The pattern's
# bracket keeps it from matching this command's own shell, which `pkill -f "hl train"` would.
pkill -f "/tmp/h[l] train" && echo "runs stopped" || echo "no runs"
while pgrep -f "/tmp/h[l] train" > /dev/null; do sleep 1; done
