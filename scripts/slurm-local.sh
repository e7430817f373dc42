#!/usr/bin/env bash
# slurm-local.sh — a throwaway single-node Slurm cluster on this machine.
#
# What it is for: hyperlens's sweep integration test (which submits a real
# Slurm job array) and trying `hyperlens sweep submit` locally, without a
# real cluster. It uses Debian's packages `slurm-wlm` (slurmctld, slurmd,
# slurm-client) and `munge`, runs every Slurm daemon as root with all of its
# config, state, spool, pid and log files under one directory, and talks only
# over the loopback address.
#
# Usage (as root):
#   scripts/slurm-local.sh install      # apt-get install slurm-wlm munge if missing
#   scripts/slurm-local.sh start DIR    # bring up the cluster; last stdout line is
#                                       #   export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-local.sh stop DIR     # cancel jobs, stop what `start DIR` started
#
#   eval "$(scripts/slurm-local.sh start "$dir")"
#   sbatch --parsable --array=0-2 --wrap 'echo $SLURM_ARRAY_TASK_ID'
#   scripts/slurm-local.sh stop "$dir"
#
# Environment (optional): SLURM_LOCAL_CTLD_PORT (default 6817),
# SLURM_LOCAL_SLURMD_PORT (default 6818), SLURM_LOCAL_TIMEOUT (seconds to wait
# for the node to become idle, default 60).
#
# The only line `start` writes to stdout is the final `export SLURM_CONF=...`; all
# messages go to stderr, prefixed `slurm-local:`.
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

CTLD_PORT="${SLURM_LOCAL_CTLD_PORT:-6817}"
SLURMD_PORT="${SLURM_LOCAL_SLURMD_PORT:-6818}"
UP_TIMEOUT="${SLURM_LOCAL_TIMEOUT:-60}"
MUNGE_KEY=/etc/munge/munge.key

log() { echo "slurm-local: $*" >&2; }
die() { echo "slurm-local: $*" >&2; exit 1; }

usage() {
  echo "usage: $0 install | start DIR | stop DIR" >&2
  exit 2
}

have_all() {
  local c
  for c in slurmctld slurmd sbatch munged; do
    command -v "$c" >/dev/null 2>&1 || return 1
  done
}

# ---------------------------------------------------------------- install
cmd_install() {
  if have_all; then
    log "slurmctld, slurmd, sbatch and munged already installed ($(slurmd -V 2>/dev/null || echo '?')); nothing to do"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "cannot install: must run as root"
  log "installing Debian packages slurm-wlm slurm-client munge"
  if ! apt-get update >&2; then
    die "cannot install: apt-get update failed"
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurm-wlm slurm-client munge >&2; then
    die "cannot install: apt-get install slurm-wlm slurm-client munge failed"
  fi
  have_all || die "cannot install: packages installed but slurmctld/slurmd/sbatch/munged still not on PATH"
  log "installed $(slurmd -V 2>/dev/null) and $(munged -V 2>/dev/null | head -n1)"
}

# ---------------------------------------------------------------- helpers
# pid_alive PID NAME: PID runs and its command name is NAME (guards against pid reuse).
pid_alive() {
  local pid="$1" name="$2" comm state
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
  [ "$comm" = "$name" ] || return 1
  # A zombie (state Z) is already dead; only its parent has not reaped it yet.
  state="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$pid/status" 2>/dev/null)"
  [ "$state" != Z ]
}

# kill_pid PID NAME: TERM, wait up to 10 s, then KILL.
kill_pid() {
  local pid="$1" name="$2"
  pid_alive "$pid" "$name" || return 0
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    pid_alive "$pid" "$name" || return 0
    sleep 0.2
  done
  log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.2
}

# kill_pidfile FILE NAME
kill_pidfile() {
  local file="$1" name="$2" pid
  [ -f "$file" ] || return 0
  pid="$(tr -dc '0-9' <"$file" 2>/dev/null || true)"
  [ -n "$pid" ] && kill_pid "$pid" "$name"
  rm -f "$file"
}

# dir_daemons DIR: pids of slurmctld/slurmd/slurmstepd that belong to DIR
# (their command line names DIR/slurm.conf or their environment has
# SLURM_CONF=DIR/slurm.conf), whether or not the pid files still exist.
dir_daemons() {
  local conf="$1/slurm.conf" p pid comm
  for p in /proc/[0-9]*; do
    pid="${p#/proc/}"
    comm="$(cat "$p/comm" 2>/dev/null)" || continue
    case "$comm" in slurmctld|slurmd|slurmstepd) ;; *) continue ;; esac
    if { tr '\0' '\n' <"$p/cmdline"; } 2>/dev/null | grep -qxF -- "$conf" ||
       { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qxF -- "SLURM_CONF=$conf"; then
      echo "$pid $comm"
    fi
  done
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# ---------------------------------------------------------------- munge
ensure_munge_key() {
  if [ -s "$MUNGE_KEY" ]; then
    log "using existing munge key $MUNGE_KEY"
    return 0
  fi
  log "creating munge key $MUNGE_KEY"
  install -d -m 0700 -o munge -g munge /etc/munge
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$MUNGE_KEY" --force >&2
  elif command -v create-munge-key >/dev/null 2>&1; then
    create-munge-key -f >&2
  else
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
  fi
  chown munge:munge "$MUNGE_KEY"
  chmod 0400 "$MUNGE_KEY"
}

ensure_munged() {
  local dir="$1" pid=""
  if munge_ok; then
    log "munged already answering; not starting another"
    return 0
  fi
  ensure_munge_key
  install -d -m 0755 -o munge -g munge /run/munge
  install -d -m 0700 -o munge -g munge /var/lib/munge /var/log/munge
  log "starting munged"
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- munged >&2
  else
    munged --force >&2
  fi
  for _ in $(seq 1 50); do
    munge_ok && break
    sleep 0.2
  done
  munge_ok || die "munged started but 'munge -n | unmunge' still fails (see /var/log/munge/munged.log)"
  pid="$(cat /run/munge/munged.pid 2>/dev/null || pgrep -n -x munged || true)"
  echo "pid=$pid" >"$dir/munged.started"
  log "munged running (pid ${pid:-?}); recorded in $dir/munged.started"
}

# ---------------------------------------------------------------- slurm
write_conf() {
  local dir="$1" host cpus
  host="$(hostname -s)"
  cpus="$(nproc)"
  mkdir -p "$dir/state" "$dir/spool"
  chmod 0755 "$dir/state" "$dir/spool"
  cat >"$dir/slurm.conf" <<EOF
# Generated by scripts/slurm-local.sh for a single-node test cluster.
ClusterName=hyperlens-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  log "wrote $dir/slurm.conf (node $host, $cpus CPUs, ports $CTLD_PORT/$SLURMD_PORT)"
}

show_logs() {
  local dir="$1" f
  for f in "$dir/slurmctld.log" "$dir/slurmd.log"; do
    echo "----- tail of $f -----" >&2
    tail -n 30 "$f" >&2 2>/dev/null || echo "(missing)" >&2
  done
}

wait_idle() {
  local dir="$1" state="" deadline=$((SECONDS + UP_TIMEOUT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    state="$(timeout 10 sinfo -h -o %T 2>/dev/null | head -n1 || true)"
    case "$state" in
      idle) return 0 ;;
    esac
    sleep 0.5
  done
  log "node did not become idle within ${UP_TIMEOUT}s (last state: '${state:-none}')"
  show_logs "$dir"
  return 1
}

cmd_start() {
  local dir="$1" t0=$SECONDS
  [ "$(id -u)" -eq 0 ] || die "start must run as root (slurmd runs jobs as their owner)"
  have_all || die "slurm or munge missing; run '$0 install' first"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  case "$dir" in /|/etc|/etc/*) die "refusing to use $dir as the cluster directory" ;; esac
  export SLURM_CONF="$dir/slurm.conf"

  if [ -f "$dir/slurmctld.pid" ] || [ -f "$dir/slurmd.pid" ] || [ -n "$(dir_daemons "$dir")" ]; then
    log "a previous cluster from $dir may be running; stopping it first"
    stop_slurm "$dir"
  fi

  ensure_munged "$dir"
  write_conf "$dir"
  rm -f "$dir/slurmctld.log" "$dir/slurmd.log"

  log "starting slurmctld ($(slurmctld -V))"
  slurmctld -c -f "$SLURM_CONF" >&2 || { show_logs "$dir"; die "slurmctld failed to start"; }
  log "starting slurmd"
  slurmd -f "$SLURM_CONF" >&2 || { show_logs "$dir"; die "slurmd failed to start"; }

  if ! wait_idle "$dir"; then
    stop_slurm "$dir"
    die "cluster in $dir did not come up"
  fi
  log "cluster up in $((SECONDS - t0))s: $(sinfo -h -o '%P %D %T %c' | head -n1)"
  echo "export SLURM_CONF=$SLURM_CONF"
}

# wait_steps_gone DIR: give cancelled jobs up to 10 s to end their slurmstepd.
wait_steps_gone() {
  local dir="$1"
  for _ in $(seq 1 50); do
    dir_daemons "$dir" | grep -q ' slurmstepd$' || return 0
    sleep 0.2
  done
  log "job steps of $dir still running after scancel; killing them"
}

# stop_slurm DIR: cancel jobs, stop slurmd, slurmctld and leftover steps of DIR.
stop_slurm() {
  local dir="$1" pid comm
  export SLURM_CONF="$dir/slurm.conf"
  if [ -f "$dir/slurmctld.pid" ] && pid_alive "$(tr -dc '0-9' <"$dir/slurmctld.pid")" slurmctld; then
    log "cancelling all jobs"
    timeout 15 scancel --full --quiet --user=root 2>/dev/null || true
    timeout 15 squeue -h -o %A 2>/dev/null | xargs -r timeout 15 scancel --full --quiet 2>/dev/null || true
    wait_steps_gone "$dir"
  fi
  kill_pidfile "$dir/slurmd.pid" slurmd
  kill_pidfile "$dir/slurmctld.pid" slurmctld
  # Anything of DIR still around (stale pid file, leftover slurmstepd).
  while read -r pid comm; do
    [ -n "${pid:-}" ] && kill_pid "$pid" "$comm"
  done < <(dir_daemons "$dir")
}

stop_munged() {
  local dir="$1" pid
  [ -f "$dir/munged.started" ] || return 0
  pid="$(sed -n 's/^pid=//p' "$dir/munged.started" | tr -dc '0-9')"
  if [ -n "$pid" ]; then
    kill_pid "$pid" munged
  fi
  rm -f "$dir/munged.started"
}

cmd_stop() {
  local dir="$1"
  if [ ! -d "$dir" ]; then
    log "$dir does not exist; nothing to stop"
    return 0
  fi
  dir="$(cd "$dir" && pwd -P)"
  stop_slurm "$dir"
  stop_munged "$dir"
  if [ -n "$(dir_daemons "$dir")" ]; then
    log "warning: processes of $dir still running: $(dir_daemons "$dir" | tr '\n' ' ')"
  fi
  log "stopped cluster of $dir"
}

# ---------------------------------------------------------------- main
main() {
  [ $# -ge 1 ] || usage
  case "$1" in
    install) [ $# -eq 1 ] || usage; cmd_install ;;
    start)   [ $# -eq 2 ] || usage; cmd_start "$2" ;;
    stop)    [ $# -eq 2 ] || usage; cmd_stop "$2" ;;
    -h|--help|help) usage ;;
    *) usage ;;
  esac
}

main "$@"
