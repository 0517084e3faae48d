#!/usr/bin/env bash
# Starts a real single-node Slurm (Debian's slurm-wlm and munge) on this
# machine, for tests and demonstrations: munged, slurmctld and slurmd with a
# configuration of our own under $TELAR_SLURM_DIR (default /tmp/telar-slurm).
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

mkdir -p "$dir"/{state,spool,log}
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024))

# munge: the package made a key; the daemon runs as its own user.
if ! pgrep -x munged >/dev/null; then
  [[ -f /etc/munge/munge.key ]] || mungekey --create >/dev/null
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
fi
munge -n | unmunge >/dev/null 2>&1 || fail "munge does not authenticate (see /var/log/munge/munged.log)"

# No cgroups in containers and small VMs: track processes by pid, bind
# tasks with sched_setaffinity.
cat >"$conf.new" <<CONF
ClusterName=telar
SlurmctldHost=$host
SlurmUser=root
SlurmctldPort=6917
SlurmdPort=6918
AuthType=auth/munge
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
  # A new configuration: restart the daemons once the old ones are gone.
  pkill -x slurmctld 2>/dev/null || true
  pkill -x slurmd 2>/dev/null || true
  for _ in $(seq 30); do
    pgrep -x 'slurmctld|slurmd' >/dev/null || break
    sleep 0.5
  done
else
  rm -f "$conf.new"
fi
export SLURM_CONF=$conf

pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld -f "$conf" || fail "slurmctld did not start (see $dir/log/slurmctld.log)"
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd -f "$conf" || fail "slurmd did not start (see $dir/log/slurmd.log)"

# The node must come up idle before jobs can run.
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  case $state in
  idle* | mixed* | allocated*) echo "export SLURM_CONF=$conf"; exit 0 ;;
  down* | drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
fail "node $host did not become idle (state '${state:-unknown}'; see $dir/log/)"
