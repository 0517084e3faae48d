#!/usr/bin/env bash
# Starts an emulated cluster on this machine: N nodes, each a network + UTS +
# mount namespace with its own hostname (node1 ... nodeN), joined by veth
# pairs to a bridge, with munge and Slurm (slurmctld on "head", one slurmd per
# node) so that `sbatch -N 2` / `srun -N 2` place ranks on different nodes.
#   scripts/cluster/start.sh N [--rate 1gbit] [--delay 100us] [--cores-per-node K]
# --rate / --delay shape every node's link with tc netem: a packet from one
# node to another is delayed once (--delay is the one-way latency between
# nodes) and limited to --rate on the sender's link and on the receiver's.
# --cores-per-node K gives node i the machine's cores (i-1)K ... iK-1 (modulo
# the cores: nodes share them round robin when there are fewer) and Slurm
# CPUs=K, as a node of its own cores would be; by default every node has
# every core, and each node's MPI ranks bind from core 0, on the same cores.
# State, configuration and logs: $TELAR_CLUSTER_DIR (default
# /tmp/telar-cluster). Idempotent: a running cluster of the same shape is
# reused; another shape is stopped and started again. Needs root. A step
# that fails names itself and its log, stops what was started (the logs
# stay; TELAR_CLUSTER_KEEP_ON_FAILURE=1 keeps everything for a look) and
# exits 1.
# See docs/cluster.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"

usage() { echo "usage: start.sh N [--rate RATE] [--delay DELAY] [--cores-per-node K]   e.g. start.sh 2 --rate 1gbit --delay 100us" >&2; exit 2; }
[[ $# -ge 1 && $1 =~ ^[1-9][0-9]*$ ]] || usage
n=$1
shift
rate="" delay="" per_node=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --rate) [[ $# -ge 2 ]] || usage; rate=$2; shift 2 ;;
  --delay) [[ $# -ge 2 ]] || usage; delay=$2; shift 2 ;;
  --cores-per-node) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || usage; per_node=$2; shift 2 ;;
  *) usage ;;
  esac
done
((n <= 32)) || { echo "start.sh: at most 32 nodes" >&2; exit 2; }

t0=$(date +%s.%N)
log=$cluster_dir/log
step_name=""
step() { step_name=$1; }
# fail MESSAGE [LOG]: names the step and the log to read.
fail() {
  echo "start.sh: step '$step_name' failed: $1${2:+ (log: $2)}" >&2
  if [[ -n ${2:-} && -f $2 ]]; then
    echo "--- last lines of $2:" >&2
    tail -n 15 "$2" >&2
  fi
  if ((started)) && [[ ${TELAR_CLUSTER_KEEP_ON_FAILURE:-0} != 1 ]]; then
    "$here/stop.sh" >/dev/null 2>&1 || true
  fi
  exit 1
}
started=0

step "prerequisites"
[[ $(id -u) == 0 ]] || fail "must run as root (namespaces, bridge, slurmd)"
for tool in flock unshare nsenter ip tc munged mungekey munge unmunge slurmctld slurmd sinfo scontrol; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    fail "$tool not found: install iproute2, util-linux, munge and slurm-wlm (scripts/setup.sh does)"
done
export PATH=$PATH:/usr/sbin:/sbin
have_netem=0
if [[ -n $rate || -n $delay ]]; then
  unshare --net tc qdisc add dev lo root netem delay 0ms >/dev/null 2>&1 && have_netem=1
  ((have_netem)) || [[ -z $delay ]] ||
    fail "--delay needs the kernel's netem qdisc (sch_netem), which this kernel ($(uname -r)) lacks; --rate alone works (tbf)"
fi

# One start or stop at a time per cluster directory.
if [[ -z ${TELAR_CLUSTER_LOCKED:-} ]]; then
  exec 9>"$cluster_dir.lock"
  flock -w 120 9 || fail "another start.sh or stop.sh on $cluster_dir held its lock ($cluster_dir.lock) for 120 s"
  export TELAR_CLUSTER_LOCKED=1
fi

cores_shape=all
((per_node > 0)) && cores_shape=$per_node
shape="nodes=$n rate=${rate:-none} delay=${delay:-none} cores_per_node=$cores_shape"
# Reuse a running cluster of the same shape whose nodes are all up.
if [[ -f $cluster_dir/shape && $(<"$cluster_dir/shape") == "$shape" && -f $cluster_dir/env ]]; then
  ok=1
  for node in head $(seq -f 'node%g' 1 "$n"); do holder_pid "$node" >/dev/null || ok=0; done
  if ((ok)); then
    source "$cluster_dir/env"
    idle=$(in_node head sinfo -h -o '%T %D' 2>/dev/null | awk '$1 ~ /^(idle|mixed|allocated)/ {s += $2} END {print s + 0}')
    if [[ $idle == "$n" ]]; then
      echo "start.sh: cluster in $cluster_dir already running ($shape)"
      exit 0
    fi
  fi
fi
# Anything else there (another shape, a half-started or dead cluster) goes.
started=1
if [[ -d $cluster_dir ]]; then
  TELAR_CLUSTER_DIR=$cluster_dir "$here/stop.sh" >/dev/null 2>&1 || true
fi
rm -rf "$log"
mkdir -p "$cluster_dir"/{log,ns,run,ctld,shared,mnt/scratch,munge}
touch "$cluster_dir/.telar-cluster" # stop.sh only empties a directory marked so
echo "$shape" >"$cluster_dir/shape.new" # becomes shape once everything is up
rm -f "$cluster_dir/shape"
for i in $(seq 1 "$n"); do mkdir -p "$cluster_dir/nodes/node$i"/{scratch,spool}; done
# The daemons run under names of their own (tc-munged, tc-slurmctld,
# tc-slurmd: links to the real ones), so that `pkill -x slurmd` or
# `pgrep -x munged` elsewhere on the machine (another Slurm, an older
# start_local_slurm.sh) neither kills them nor takes them for its own.
mkdir -p "$cluster_dir/bin"
for d in munged slurmctld slurmd; do
  ln -sfn "$(command -v "$d")" "$cluster_dir/bin/tc-$d"
done

# --- munge: our own daemon, key and socket (nothing shared with the host's) --
step "munge"
chmod 0700 "$cluster_dir/munge"
[[ -f $cluster_dir/munge/munge.key ]] ||
  mungekey --create --keyfile="$cluster_dir/munge/munge.key" >>"$log/munged.log" 2>&1 ||
  fail "mungekey could not create a key" "$log/munged.log"
sock=$cluster_dir/munge/munge.socket
"$cluster_dir/bin/tc-munged" --force --socket="$sock" --key-file="$cluster_dir/munge/munge.key" \
  --pid-file="$cluster_dir/munge/munged.pid" --seed-file="$cluster_dir/munge/munged.seed" \
  --log-file="$log/munged.log" >>"$log/munged.log" 2>&1 9>&- ||
  fail "munged did not start" "$log/munged.log"
munge --socket="$sock" -n 2>>"$log/munged.log" | unmunge --socket="$sock" >/dev/null 2>>"$log/munged.log" ||
  fail "munge does not authenticate through $sock" "$log/munged.log"

# --- hosts file the nodes see (bind-mounted over /etc/hosts in their mount
# namespaces only; the host's /etc/hosts is never touched) -------------------
step "hosts file"
{
  echo "127.0.0.1 localhost"
  echo "$cluster_head_addr head"
  for i in $(seq 1 "$n"); do echo "$(node_addr "$i") node$i"; done
} >"$cluster_dir/hosts"

# --- namespaces: one holder process per node --------------------------------
# start_holder NODE: network, UTS and mount namespaces held by a sleep; named
# in `ip netns`; hostname NODE; the cluster's hosts file; lo up.
start_holder() {
  local node=$1 ns pid
  ns=$(ns_name "$node")
  step "namespaces of $node"
  setsid unshare --net --uts --mount --propagation private -- sleep infinity </dev/null >>"$log/namespaces.log" 2>&1 9>&- &
  pid=$!
  for _ in $(seq 50); do
    [[ $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) != $(stat -L -c %i /proc/self/ns/net) ]] && break
    [[ -d /proc/$pid ]] || fail "unshare exited" "$log/namespaces.log"
    sleep 0.1
  done
  echo "$pid" >"$cluster_dir/ns/$node.pid"
  stat -L -c %i "/proc/$pid/ns/net" >"$cluster_dir/ns/$node.net"
  ip netns attach "$ns" "$pid" >>"$log/namespaces.log" 2>&1 || fail "ip netns attach $ns $pid" "$log/namespaces.log"
  {
    nsenter -t "$pid" --uts hostname "$node" &&
      nsenter -t "$pid" --mount mount --bind "$cluster_dir/hosts" /etc/hosts &&
      ip -n "$ns" link set lo up
  } >>"$log/namespaces.log" 2>&1 || fail "hostname, hosts file or lo in $ns" "$log/namespaces.log"
  if [[ $node != head ]]; then
    nsenter -t "$pid" --mount mount --bind "$cluster_dir/nodes/$node/scratch" "$cluster_dir/mnt/scratch" \
      >>"$log/namespaces.log" 2>&1 || fail "scratch mount in $ns" "$log/namespaces.log"
  fi
}
start_holder head
for i in $(seq 1 "$n"); do start_holder "node$i"; done

# --- network: bridge br0 in head, node i's eth0 <-> port node<i> on br0 -----
step "bridge"
head_ns=$(ns_name head)
{
  ip -n "$head_ns" link add br0 type bridge &&
    ip -n "$head_ns" addr add "$cluster_head_addr/24" dev br0 &&
    ip -n "$head_ns" link set br0 up
} >>"$log/network.log" 2>&1 || fail "bridge br0 in $head_ns" "$log/network.log"
for i in $(seq 1 "$n"); do
  step "link of node$i"
  ns=$(ns_name "node$i")
  {
    ip -n "$head_ns" link add "node$i" type veth peer name eth0 netns "$ns" &&
      ip -n "$head_ns" link set "node$i" master br0 up &&
      ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0 &&
      ip -n "$ns" link set eth0 up
  } >>"$log/network.log" 2>&1 || fail "veth node$i <-> eth0 in $ns" "$log/network.log"
  if [[ -n $rate || -n $delay ]]; then
    step "shaping of node$i"
    # Sender side (eth0): delay and rate; receiver side (the bridge port):
    # rate. netem does both; a kernel without sch_netem (some VM kernels)
    # still has tbf for the rate, but nothing to add delay with.
    if ((have_netem)); then
      out=(netem limit 100000) in=(netem limit 100000)
      [[ -n $delay ]] && out+=(delay "$delay")
      [[ -n $rate ]] && out+=(rate "$rate") in+=(rate "$rate")
    else
      out=(tbf rate "$rate" burst 256kb latency 50ms) in=("${out[@]}")
    fi
    {
      tc -n "$ns" qdisc replace dev eth0 root "${out[@]}" &&
        tc -n "$head_ns" qdisc replace dev "node$i" root "${in[@]}"
    } >>"$log/network.log" 2>&1 || fail "tc qdisc ${out[*]} on node$i" "$log/network.log"
  fi
done

# --- Slurm -------------------------------------------------------------------
step "slurm.conf"
conf=$cluster_dir/slurm.conf
cpus=$(nproc)
# node_cores I: the cores node I may run on (taskset list), with --cores-per-node.
node_cores() {
  local k list=""
  for ((k = 0; k < per_node; k++)); do list+="${list:+,}$(((($1 - 1) * per_node + k) % cpus))"; done
  echo "$list"
}
{
  cat <<CONF
# Generated by scripts/cluster/start.sh for the cluster in $cluster_dir.
ClusterName=telarcluster
SlurmctldHost=head($cluster_head_addr)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$cluster_dir/ctld
SlurmdSpoolDir=$cluster_dir/nodes/%n/spool
SlurmctldPidFile=$cluster_dir/run/slurmctld.pid
SlurmdPidFile=$cluster_dir/nodes/%n/slurmd.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd-%n.log
TmpFS=$cluster_dir/mnt/scratch
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
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
MessageTimeout=20
SlurmctldTimeout=30
SlurmdTimeout=60
CONF
  for i in $(seq 1 "$n"); do
    echo "NodeName=node$i NodeHostname=node$i NodeAddr=$(node_addr "$i") CPUs=$((per_node > 0 ? per_node : cpus)) RealMemory=1024 State=UNKNOWN"
  done
  echo "PartitionName=cluster Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} >"$conf"

# What every command on the cluster gets (run.sh sources it; jobs inherit it
# from sbatch/srun): Slurm's configuration, MPI over TCP on eth0 between
# nodes and shared memory inside one.
cat >"$cluster_dir/env" <<ENV
export SLURM_CONF=$conf
export TELAR_CLUSTER_DIR=$cluster_dir
export TELAR_CLUSTER_SHARED=$cluster_dir/shared
export TELAR_CLUSTER_SCRATCH=$cluster_dir/mnt/scratch
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self,vader
export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
export UCX_TLS=tcp,self,sm UCX_NET_DEVICES=eth0
export HYDRA_IFACE=eth0
ENV
source "$cluster_dir/env"

step "slurmctld"
in_node head "$cluster_dir/bin/tc-slurmctld" -f "$conf" >>"$log/slurmctld.log" 2>&1 || fail "slurmctld did not start" "$log/slurmctld.log"
for i in $(seq 1 "$n"); do
  step "slurmd on node$i"
  pin=()
  ((per_node > 0)) && pin=(taskset -c "$(node_cores "$i")") # its jobs inherit the cores
  in_node "node$i" "${pin[@]}" "$cluster_dir/bin/tc-slurmd" -f "$conf" -N "node$i" >>"$log/slurmd-node$i.log" 2>&1 ||
    fail "slurmd did not start" "$log/slurmd-node$i.log"
done

step "nodes idle"
deadline=$((SECONDS + ${TELAR_CLUSTER_START_TIMEOUT:-60}))
while :; do
  states=$(in_node head sinfo -h -N -o '%N %T' 2>>"$log/sinfo.log" || true)
  busy=$(awk '$2 !~ /^(idle|mixed|allocated)/ {print $1 "=" $2}' <<<"$states")
  [[ -n $states && -z $busy ]] && break
  # A node that registered with a stale state comes back.
  for nd in $(awk '$2 ~ /^(down|drain)/ {print $1}' <<<"$states"); do
    in_node head scontrol update nodename="$nd" state=resume >/dev/null 2>&1 || true
  done
  if ((SECONDS > deadline)); then
    fail "nodes not idle after ${TELAR_CLUSTER_START_TIMEOUT:-60} s: ${busy:-no answer from slurmctld}" "$log/slurmctld.log (and $log/slurmd-<node>.log)"
  fi
  sleep 0.5
done
mv "$cluster_dir/shape.new" "$cluster_dir/shape"
t1=$(date +%s.%N)
awk -v n="$n" -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" -v s="$shape" -v d="$cluster_dir" \
  'BEGIN {printf "start.sh: %d node(s) up in %.1f s (%s); state and logs in %s\n", n, t, s, d}'
echo "start.sh: run commands with $here/run.sh head|node1..node$n CMD, e.g. $here/run.sh head sbatch -N 2 ..."
