# Shared by start.sh, stop.sh and run.sh (sourced, not run).
#
# One emulated cluster lives in $TELAR_CLUSTER_DIR (default
# /tmp/telar-cluster). Everything it creates is named after an id derived
# from that directory, so two clusters (two build trees) never collide:
#   network namespaces  tc<id>-head, tc<id>-node1 ... tc<id>-nodeN
#   (visible in `ip netns list`), each held by one `sleep` that also holds
#   the node's UTS (hostname) and mount namespaces.
# The bridge lives inside the head namespace, not on the host: the nodes'
# subnet (10.77.0.0/24) is invisible from the host's own network stack,
# every instance can use the same addresses and ports, and no packet can
# leave the machine (the namespaces have no route but their subnet).

cluster_dir=${TELAR_CLUSTER_DIR:-/tmp/telar-cluster}
cluster_dir=${cluster_dir%/}
cluster_id=$(printf '%s' "$cluster_dir" | md5sum | cut -c1-5)
cluster_prefix=tc$cluster_id
cluster_subnet=10.77.0
cluster_head_addr=$cluster_subnet.1

# node_addr I: the address of node I (1-based).
node_addr() { echo "$cluster_subnet.$((10 + $1))"; }
# ns_name NODE: the network namespace name of head or nodeI.
ns_name() { echo "$cluster_prefix-$1"; }
# holder_pid NODE: the pid holding NODE's namespaces, if it is alive.
holder_pid() {
  local f=$cluster_dir/ns/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ -n $pid && -d /proc/$pid ]] || return 1
  # The pid must still be our holder (pids are reused): the net namespace
  # recorded when it started (inside a node, /run/netns may not show them).
  [[ $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) == $(cat "$cluster_dir/ns/$1.net" 2>/dev/null) ]] || return 1
  echo "$pid"
}
# in_node NODE CMD...: CMD in NODE's network, UTS and mount namespaces, in
# the caller's working directory.
in_node() {
  local node=$1 pid
  shift
  pid=$(holder_pid "$node") || { echo "telar-cluster: node '$node' is not running (start it with scripts/cluster/start.sh)" >&2; return 3; }
  nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@" 9>&- # no daemon keeps start.sh's lock
}
