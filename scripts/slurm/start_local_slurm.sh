#!/usr/bin/env bash
# Starts a real single-node Slurm (Debian's slurm-wlm and munge) on this
# machine, for tests and demonstrations: munged, slurmctld and slurmd with a
# configuration of our own under $TELAR_SLURM_DIR (default /tmp/telar-slurm).
# Each directory is its own instance: its own munged (socket and key in the
# directory), ports derived from the directory's name, daemons tracked by
# their pid files, so two instances (two build trees, or the emulated
# cluster of scripts/cluster/) never stop or reuse each other's daemons.
# Idempotent: a running instance is reused. Prints the line to source:
#   eval "$(scripts/slurm/start_local_slurm.sh)"     # sets SLURM_CONF
# Needs root (slurmd launches jobs as their user). Exits non-zero, naming
# the step, when Slurm cannot be started.
set -euo pipefail

dir=${TELAR_SLURM_DIR:-/tmp/telar-slurm}
conf=$dir/slurm.conf
fail() { echo "start_local_slurm: $*" >&2; exit 1; }

for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    fail "$tool not found: install slurm-wlm and munge (scripts/setup.sh does)"
done
[[ $(id -u) == 0 ]] || fail "must run as root (slurmd starts jobs as their user)"

mkdir -p "$dir"/{state,spool,log,munge}
export PATH=$PATH:/usr/sbin:/sbin
host=$(hostname -s)
# Ports of this instance: from the directory's name, in 20000-39999.
port=$((20000 + 2 * (0x$(printf '%s' "$dir" | md5sum | cut -c1-4) % 10000)))
# The daemons run under names of their own (links telar-munged,
# telar-slurmctld, telar-slurmd), so that `pkill -x slurmd` / `pgrep -x
# munged` elsewhere (an older copy of this script, another Slurm) neither
# kills them nor takes them for its own.
mkdir -p "$dir/bin"
for d in munged slurmctld slurmd; do ln -sfn "$(command -v "$d")" "$dir/bin/telar-$d"; done
# alive PIDFILE NAME: the pid in PIDFILE, if it is a running NAME.
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  # (or the plain name: an instance started before the links)
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == @("$2"|"${2#telar-}") ]] || return 1
  echo "$pid"
}
cpus=$(nproc)
mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024))

# munge: a daemon of this instance, with its own key and socket.
sock=$dir/munge/munge.socket
if ! alive "$dir/munge/munged.pid" telar-munged >/dev/null; then
  chmod 0700 "$dir/munge"
  [[ -f $dir/munge/munge.key ]] || mungekey --create --keyfile="$dir/munge/munge.key" >>"$dir/log/munged.log" 2>&1 ||
    fail "mungekey could not create $dir/munge/munge.key (see $dir/log/munged.log)"
  "$dir/bin/telar-munged" --force --socket="$sock" --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
    --seed-file="$dir/munge/munged.seed" --log-file="$dir/log/munged.log" >>"$dir/log/munged.log" 2>&1 ||
    fail "munged did not start (see $dir/log/munged.log)"
fi
munge --socket="$sock" -n 2>/dev/null | unmunge --socket="$sock" >/dev/null 2>&1 ||
  fail "munge does not authenticate through $sock (see $dir/log/munged.log)"

# No cgroups in containers and small VMs: track processes by pid, bind
# tasks with sched_setaffinity.
cat >"$conf.new" <<CONF
ClusterName=telar
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=telar Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
if ! cmp -s "$conf.new" "$conf" 2>/dev/null; then
  mv "$conf.new" "$conf"
  # A new configuration: restart this instance's daemons (by pid file; the
  # daemons of other instances are left alone) once they are gone.
  for d in slurmctld slurmd; do
    pid=$(alive "$dir/$d.pid" "telar-$d") && kill "$pid" 2>/dev/null || true
  done
  for _ in $(seq 30); do
    alive "$dir/slurmctld.pid" telar-slurmctld >/dev/null || alive "$dir/slurmd.pid" telar-slurmd >/dev/null || break
    sleep 0.5
  done
else
  rm -f "$conf.new"
fi
export SLURM_CONF=$conf

alive "$dir/slurmctld.pid" telar-slurmctld >/dev/null || "$dir/bin/telar-slurmctld" -f "$conf" || fail "slurmctld did not start (see $dir/log/slurmctld.log)"
alive "$dir/slurmd.pid" telar-slurmd >/dev/null || "$dir/bin/telar-slurmd" -f "$conf" || fail "slurmd did not start (see $dir/log/slurmd.log)"

# The node must come up idle before jobs can run.
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  case $state in
  idle* | mixed* | allocated*) echo "export SLURM_CONF=$conf"; exit 0 ;;
  down* | drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
fail "waited 60 s for node $host to become idle in slurmctld (port $port); its state is '${state:-no answer from slurmctld}' (see $dir/log/slurmctld.log and slurmd.log)"
