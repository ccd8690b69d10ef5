#!/bin/bash
# slurm-local.sh: a one-node Slurm cluster on this machine (Debian's slurm-wlm 22.05 and munge), for running air's
# enroot backend through `srun` and `sbatch` as a Slurm node would (docs/hpc.md, "Slurm"). Not part of CI. As root.
#
#   scripts/slurm-local.sh deps       Debian's slurm-wlm and munge
#   scripts/slurm-local.sh up         its configuration, then munged, slurmctld and slurmd started; waits for the node
#                                     (a configuration that changed, SLURM_LOCAL_GPUS, restarts running daemons;
#                                     refused, exit 1, while jobs run)
#   scripts/slurm-local.sh env        prints `export SLURM_CONF=...` for srun, sbatch and sinfo (any user)
#   scripts/slurm-local.sh status     the daemons and `sinfo` (exit 1, at once, when nothing is set up or running)
#   scripts/slurm-local.sh down       the daemons stopped, the cluster's state removed (the configuration stays)
#
# Everything lives under $SLURM_LOCAL_DIR (default /var/lib/air-slurm-local, readable by every user: its slurm.conf;
# an absolute path without spaces), which `up` makes or takes only when it is new or empty (its marker .air-made-by
# says so after): `down` deletes its state/ and spool/ only under that marker, and ends only the daemons whose pid
# file names a slurmctld or slurmd started with this cluster's SLURM_CONF (a stale pid file's pid, since reused by
# another process, is left alone).
# Loopback only: the node's address and the controller's are 127.0.0.1. The simplest plugins that run in a container
# without systemd: processes tracked by parentage (proctrack/linuxproc), no task plugin, no accounting; a job's
# limits are then air's own (cgroups the node delegates to the user; docs/hpc.md). SLURM_LOCAL_GPUS=N (at `up`)
# gives the node N stand-in GPUs (character devices of the NVIDIA major that nothing can open) as Slurm gres, so
# `srun --gres=gpu:1` hands a job one and sets its CUDA_VISIBLE_DEVICES as on a GPU node.
set -euo pipefail

W=${SLURM_LOCAL_DIR:-/var/lib/air-slurm-local}
CONF=$W/slurm.conf
NODE=$(hostname -s)
GPUS=${SLURM_LOCAL_GPUS:-0}

say() { echo "slurm-local: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$(dirname "$0")/owned.sh"
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
daemon() {  # NAME: the pid of this cluster's NAME (slurmctld, slurmd), from the pid file the daemon wrote, when that
  # process runs NAME with this cluster's SLURM_CONF (its environment is read where it can be: always as root, who
  # alone may end it); fails otherwise
  local pid
  pid=$(cat "$W/$1.pid" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && [ "$(program "$pid")" = "$1" ] || return 1
  if [ -r "/proc/$pid/environ" ]; then
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" || return 1
  fi
  echo "$pid"
}
alive() { daemon "$1" >/dev/null; }
check_variables() {  # before any step runs
  case $GPUS in
    ''|*[!0-9]*) say "SLURM_LOCAL_GPUS must be a number of stand-in GPUs, not '$GPUS'"; exit 2;;
  esac
  case $W in
    *[[:space:]\'\"\\]*) say "SLURM_LOCAL_DIR must be a path without spaces or quotes (slurm.conf holds it), not '$W'"
                        exit 2;;
    /?*) ;;
    *) say "SLURM_LOCAL_DIR must be an absolute path (slurm.conf holds it), not '$W'"; exit 2;;
  esac
}
root() { [ "$(id -u)" -eq 0 ] || { say "$1 needs root"; exit 1; }; }

deps() {
  root deps
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
  say "installed: $(slurmd -V), munge $(munged -V 2>&1 | head -1)"
}

config() {
  claim "$W" slurm-local.sh  # a folder of the user's is refused, before anything is written there
  mkdir -p "$W/state" "$W/spool" "$W/log"
  chmod 755 "$W"
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  local gres=""
  [ "$GPUS" -gt 0 ] && gres=" Gres=gpu:$GPUS"
  cat >"$CONF" <<EOF
ClusterName=airlocal
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN$gres
PartitionName=air Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 644 "$CONF"
  # Stand-in GPUs: character devices of the NVIDIA major at minors no driver uses, so that Slurm's gres/gpu plugin
  # hands jobs GPUs (and sets CUDA_VISIBLE_DEVICES) on a machine without one; nothing can open them.
  : >"$W/gres.conf"
  local i
  for ((i = 0; i < GPUS; i++)); do
    [ -e "$W/dev/gpu$i" ] || { mkdir -p "$W/dev" && mknod "$W/dev/gpu$i" c 195 $((200 + i)); }
    echo "Name=gpu File=$W/dev/gpu$i" >>"$W/gres.conf"
  done
  chmod 644 "$W/gres.conf"
}

stop_daemons() {  # this cluster's slurmd and slurmctld ended (by their pid files' checked pids), state kept
  local d pid
  for d in slurmd slurmctld; do
    if pid=$(daemon "$d"); then kill "$pid"; fi
    for _ in $(seq 20); do alive "$d" || break; sleep 0.5; done
    rm -f "$W/$d.pid"
  done
}

up() {
  root up
  command -v slurmctld >/dev/null || { say "slurm-wlm is missing: scripts/slurm-local.sh deps"; exit 1; }
  local before=""
  if [ -f "$CONF" ]; then
    before=$(cat "$CONF" "$W/gres.conf" 2>/dev/null)
    cp -p "$CONF" "$CONF.before"
    [ ! -f "$W/gres.conf" ] || cp -p "$W/gres.conf" "$W/gres.conf.before"
  fi
  config
  # Running daemons read their configuration when they started: a new one (SLURM_LOCAL_GPUS changed) needs them
  # started again, which ends every job; with jobs running that is refused.
  if [ -n "$before" ] && [ "$before" != "$(cat "$CONF" "$W/gres.conf")" ] && { alive slurmctld || alive slurmd; }; then
    local jobs
    jobs=$(SLURM_CONF=$CONF timeout 30 squeue -h -o %i 2>/dev/null | wc -l)
    if [ "$jobs" -gt 0 ]; then
      mv "$CONF.before" "$CONF"  # the configuration the daemons run with stays what the folder says
      [ ! -f "$W/gres.conf.before" ] || mv "$W/gres.conf.before" "$W/gres.conf"
      say "the configuration changed (SLURM_LOCAL_GPUS=$GPUS) but $jobs job(s) run: the daemons were not restarted" \
          "(scripts/slurm-local.sh down, then up, once they end)"
      exit 1
    fi
    say "the configuration changed (SLURM_LOCAL_GPUS=$GPUS): restarting slurmctld and slurmd"
    stop_daemons
  fi
  rm -f "$CONF.before" "$W/gres.conf.before"
  if ! pgrep -x munged >/dev/null; then
    [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key; }
    mkdir -p /run/munge && chown munge: /run/munge
    runuser -u munge -- /usr/sbin/munged
  fi
  alive slurmctld || SLURM_CONF=$CONF slurmctld
  alive slurmd || SLURM_CONF=$CONF slurmd
  for _ in $(seq 30); do
    if SLURM_CONF=$CONF sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then status; return; fi
    sleep 1
  done
  say "the node did not become idle in 30 s (logs: $W/log)"; exit 1
}

status() {
  [ -f "$CONF" ] || { say "nothing set up in $W (scripts/slurm-local.sh up)"; exit 1; }
  local d pid
  for d in slurmctld slurmd; do
    if pid=$(daemon "$d"); then say "$d running ($pid)"; else say "$d stopped"; fi
  done
  # sinfo waits a minute for a controller that is not there: asked only of one that runs
  alive slurmctld || { say "no controller: nothing to ask sinfo (scripts/slurm-local.sh up)"; exit 1; }
  SLURM_CONF=$CONF timeout 30 sinfo
}

env_() { [ -f "$CONF" ] || { say "not set up: scripts/slurm-local.sh up"; exit 1; }; printf 'export SLURM_CONF=%q\n' "$CONF"; }

down() {
  root down
  [ -e "$W" ] || { say "nothing set up in $W: nothing to stop"; return 0; }
  owned "$W" slurm-local.sh || { say "$W was not set up by slurm-local.sh (no .air-made-by of its own): nothing" \
                                     "stopped or removed"; exit 2; }
  stop_daemons
  wipe "$W" slurm-local.sh "$W/state" "$W/spool"
  say "stopped (munged, shared with other users of munge, is left running)"
}

[ $# -gt 0 ] || { usage; exit 2; }
for s in "$@"; do  # every argument first: a typo runs nothing
  case $s in
    -h|--help) usage; exit 0;;
    deps|up|env|status|down) ;;
    *) say "unknown step: $s (deps up env status down; --help)"; exit 2;;
  esac
done
check_variables
for s in "$@"; do
  case $s in
    deps) deps;; up) up;; env) env_;; status) status;; down) down;;
  esac
done
