# shellcheck shell=bash
# telar-srun --restarts (sourced by telar-srun, which sets args: srun's
# options). Runs the program; after a failure that names a lost node, runs
# it again on the allocation's other nodes with --resume.

# lost_nodes LOG NODES...: the nodes among NODES the failed step lost, from
# its output in LOG: Slurm's "Node failure on X"; else the host(s) Telar's
# "lost host X" lines name most often (an isolated node names all the others,
# once); else the first node srun reports a task of as killed or failed
# (with --kill-on-bad-exit the others follow it).
lost_nodes() {
  local log=$1
  shift
  local found
  # (Each search may find nothing: `|| true` under telar-srun's pipefail.)
  found=$(sed -n 's/.*srun: error: Node failure on \([^ ]*\).*/\1/p' "$log" | sort -u || true)
  if [[ -z $found ]]; then
    found=$(grep -oE '(lost|and) host [^ ]+' "$log" | awk '{ c[$3]++ }
      END { for (h in c) if (c[h] > max) max = c[h]; for (h in c) if (c[h] == max) print h }' || true)
  fi
  if [[ -z $found ]]; then
    found=$(sed -n 's/^srun: error: \([^ :]*\): tasks\{0,1\} [0-9,-]*: .*/\1/p' "$log" | head -n 1 || true)
  fi
  local n
  for n in $found; do
    [[ " $* " == *" $n "* ]] && echo "$n"
  done
  return 0
}

# elastic_run RESTARTS TASKS_PER_NODE PROGRAM ARGS...
elastic_run() {
  local restarts=$1 per_node=$2 program=$3
  shift 3
  local nodes log rc attempt lost extra=()
  mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  log=$(mktemp "${TMPDIR:-/tmp}/telar-srun.XXXXXX")
  for ((attempt = 0; ; ++attempt)); do
    local list
    list=$(IFS=,; echo "${nodes[*]}")
    # stderr also into LOG (to find the lost node), stdout untouched.
    rc=0
    { srun "${args[@]}" --nodes="${#nodes[@]}" --ntasks=$((per_node * ${#nodes[@]})) --nodelist="$list" \
        "$program" "$@" "${extra[@]}" 2>&1 1>&3 3>&- | tee "$log" >&2 || rc=${PIPESTATUS[0]}; } 3>&1
    ((rc != 0)) || { rm -f "$log"; return 0; }
    if ((attempt == restarts)); then
      echo "telar-srun: the job failed (exit $rc) after $attempt restart(s) of $restarts" >&2
      return "$rc"
    fi
    mapfile -t lost < <(lost_nodes "$log" "${nodes[@]}")
    if ((${#lost[@]} == 0)); then
      echo "telar-srun: the job failed (exit $rc) and lost no node that could be named: not restarted" >&2
      return "$rc"
    fi
    local keep=() n
    for n in "${nodes[@]}"; do [[ " ${lost[*]} " == *" $n "* ]] || keep+=("$n"); done
    if ((${#keep[@]} == 0)); then
      echo "telar-srun: the job failed (exit $rc) and no node is left" >&2
      return "$rc"
    fi
    nodes=("${keep[@]}")
    extra=(--resume)
    echo "telar-srun: restart $((attempt + 1)) of $restarts without ${lost[*]}: ${#nodes[@]} node(s) x $per_node task(s) = $((per_node * ${#nodes[@]})) rank(s), from the newest checkpoint" >&2
  done
}
