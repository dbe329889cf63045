#!/usr/bin/env bash
# A local three-node RabbitMQ 4.0.x cluster on this one host, in the same
# trixie chroot as scripts/lib/rabbitmq4.sh (made there on first use, ~3 min
# at most), beside the system 3.10 node (5672) and the single 4.0 node (5673).
#
#   node  name                 AMQP             distribution
#   1     rabbit4c1@localhost  127.0.0.1:5691   25691
#   2     rabbit4c2@localhost  127.0.0.1:5692   25692
#   3     rabbit4c3@localhost  127.0.0.1:5693   25693
#
# Same Erlang cookie and epmd (127.0.0.1:4370) as the single 4.0 node, its own
# data under /srv/order-expiry/rabbit4cN in the chroot; +S 1:1 and a 1 GB
# absolute memory watermark per node (see rabbitmq4.sh).
#
# As a command:
#   scripts/lib/cluster.sh up            start the three nodes (together: a stopped
#                                        Mnesia cluster needs its peers to boot), join
#                                        2 and 3 to 1 when not yet members, enable all
#                                        feature flags, wait for 3 running nodes
#   scripts/lib/cluster.sh down          graceful stop of all three (data kept); the
#                                        chroot's /proc is unmounted when no 4.0 node runs
#   scripts/lib/cluster.sh status        each node's state, pid, RSS; cluster_status
#   scripts/lib/cluster.sh ctl N ARGS... rabbitmqctl -n rabbit4cN@localhost ARGS...;
#                                        ctl N queues|diagnostics|... ARGS... as rabbitmq4.sh
#   scripts/lib/cluster.sh kill N        kill -9 of node N's beam only
#   scripts/lib/cluster.sh stop N        graceful stop of node N (rabbitmqctl stop: the
#                                        whole node, not just the app)
#   scripts/lib/cluster.sh start N       bring node N back; it rejoins from its data dir
#                                        (joined afresh if its data was wiped). With both
#                                        other nodes down, use `up` instead: a node that
#                                        was not the last to stop waits for its peers
#   scripts/lib/cluster.sh wipe          down, then delete the three nodes' data
#   scripts/lib/cluster.sh env           print CLUSTER_* for eval
#
# Sourced: defines cluster_up, cluster_down, cluster_status, cluster_ctl N ...,
# cluster_kill N, cluster_stop N, cluster_start N, cluster_wipe, cluster_pid N,
# and CLUSTER_NODES (array of node names), CLUSTER_PORTS (AMQP ports),
# CLUSTER_URLS (amqp://guest:guest@127.0.0.1:569N/%2f). Like rabbitmq4.sh it
# changes no shell option of the caller and calls `die` (exit) on failure.
#
# Quorum queue placement: a quorum queue declared through node N gets its
# leader on N by default (queue_leader_locator client-local).
# x-queue-leader-locator = balanced (or the queue_leader_locator policy key /
# config setting) spreads leaders over the members instead; it is supported
# since RabbitMQ 3.10 (client-local | balanced) and works on this 4.0.5:
# six quorum queues declared through node 1 with it got leaders 2/2/2 on the
# three nodes, while six without it all had their leader on node 1.

_cluster_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/rabbitmq4.sh
source "$_cluster_lib_dir/rabbitmq4.sh"
# The names and ports below are the 4.0 cluster's: a 4.3 one (forky/sid
# chroot) would need its own before it could run beside it. Not done yet.
[[ $RMQ4_SUITE == trixie ]] || die "scripts/lib/cluster.sh runs on the trixie (RabbitMQ 4.0) chroot only, not ORDER_EXPIRY_RMQ4_SUITE=$RMQ4_SUITE"

CLUSTER_NODES=(rabbit4c1@localhost rabbit4c2@localhost rabbit4c3@localhost)
CLUSTER_PORTS=(5691 5692 5693)
CLUSTER_DIST_PORTS=(25691 25692 25693)
CLUSTER_URLS=(
  "amqp://guest:guest@127.0.0.1:5691/%2f"
  "amqp://guest:guest@127.0.0.1:5692/%2f"
  "amqp://guest:guest@127.0.0.1:5693/%2f"
)

# _cluster_node N: sets _name, _amqp, _dist for node N (1..3).
_cluster_node() {
  [[ "${1:-}" =~ ^[123]$ ]] || die "cluster node must be 1, 2 or 3, not '${1:-}'"
  _name=rabbit4c$1
  _amqp=${CLUSTER_PORTS[$1 - 1]}
  _dist=${CLUSTER_DIST_PORTS[$1 - 1]}
}

cluster_ctl() {
  local _name _amqp _dist
  _cluster_node "${1:-}"
  shift
  rmq4_node_ctl "$_name" "$@"
}

cluster_pid() {
  local _name _amqp _dist
  _cluster_node "${1:-}"
  rmq4_node_pid "$_name"
}

# Is node N a member (running or not) of node 1's cluster, seen from N?
_cluster_is_member() {
  local out
  out=$(cluster_ctl "$1" -q eval "lists:member('${CLUSTER_NODES[0]}', rabbit_nodes:list_members())." 2>/dev/null) || return 1
  [[ "$out" == true ]]
}

_cluster_join() {
  local n=$1
  _cluster_is_member "$n" && return 0
  log "joining ${CLUSTER_NODES[$n - 1]} to ${CLUSTER_NODES[0]}"
  cluster_ctl "$n" -q stop_app >/dev/null || die "node $n: stop_app failed"
  # Only a node that is not a member yet gets here: its data is a fresh
  # standalone node's.
  cluster_ctl "$n" -q reset >/dev/null || die "node $n: reset failed"
  cluster_ctl "$n" -q join_cluster "${CLUSTER_NODES[0]}" >/dev/null || die "node $n: join_cluster failed"
  cluster_ctl "$n" -q start_app >/dev/null || die "node $n: start_app failed"
  cluster_ctl "$n" -q await_startup >/dev/null || die "node $n: await_startup after join failed"
}

_cluster_running_count() {
  local n out
  for n in 1 2 3; do
    cluster_pid "$n" >/dev/null || continue
    if out=$(cluster_ctl "$n" -q eval 'length(rabbit_nodes:list_running()).' 2>/dev/null); then
      echo "$out"
      return 0
    fi
  done
  echo 0
}

_cluster_wait_running() {
  local want=$1 t0=$SECONDS count
  while :; do
    count=$(_cluster_running_count)
    [[ "$count" == "$want" ]] && return 0
    [[ $((SECONDS - t0)) -lt 120 ]] || die "cluster: $count running nodes, not $want, after 120 s"
    sleep 1
  done
}

cluster_up() {
  local t0=$SECONDS n _name _amqp _dist
  rmq4_prepare
  # All three at once: after a full stop each node waits for its peers' tables.
  for n in 1 2 3; do
    _cluster_node "$n"
    rmq4_node_ensure_launched "$_name" "$_amqp" "$_dist"
  done
  for n in 1 2 3; do
    _cluster_node "$n"
    rmq4_node_wait "$_name" "$_amqp"
  done
  _cluster_join 2
  _cluster_join 3
  _cluster_wait_running 3
  cluster_ctl 1 -q enable_feature_flag all >/dev/null || die "cluster: enable_feature_flag all failed"
  log "cluster up: 3 running nodes on 5691-5693 ($((SECONDS - t0)) s)"
}

cluster_start() {
  local n=${1:-} t0=$SECONDS _name _amqp _dist running
  _cluster_node "$n"
  rmq4_prepare
  rmq4_node_ensure_launched "$_name" "$_amqp" "$_dist"
  rmq4_node_wait "$_name" "$_amqp"
  if [[ "$n" != 1 ]] && cluster_pid 1 >/dev/null; then
    _cluster_join "$n"
  fi
  running=$(_cluster_running_count)
  # Enabling feature flags is cluster-wide: it fails (missing_clustered_nodes)
  # while a member is down, so only with all three running.
  if [[ "$running" == 3 ]]; then
    cluster_ctl "$n" -q enable_feature_flag all >/dev/null || die "cluster: enable_feature_flag all failed"
  fi
  log "cluster node $n up (pid $(cluster_pid "$n")); running nodes: $running ($((SECONDS - t0)) s)"
}

cluster_stop() {
  local _name _amqp _dist
  _cluster_node "${1:-}"
  rmq4_node_stop "$_name"
}

cluster_kill() {
  local _name _amqp _dist
  _cluster_node "${1:-}"
  rmq4_node_kill "$_name"
}

cluster_down() {
  local n
  # Node 1 last: it is the one to boot first should the nodes be started one
  # by one (`up` starts all three together anyway).
  for n in 3 2 1; do cluster_stop "$n"; done
}

cluster_wipe() {
  local n
  cluster_down
  for n in 1 2 3; do
    log "deleting the data of rabbit4c$n@localhost"
    rm -rf --one-file-system "${RMQ4_ROOT:?}$RMQ4_DATA/rabbit4c$n"
  done
}

cluster_status() {
  local n _name _amqp _dist any=0
  if ! rmq4_ready; then
    echo "no chroot at $RMQ4_ROOT (scripts/lib/rabbitmq4.sh ensure makes it)"
    return 1
  fi
  for n in 1 2 3; do
    _cluster_node "$n"
    rmq4_node_status_line "$_name" "$_amqp"
  done
  for n in 1 2 3; do
    if cluster_pid "$n" >/dev/null && port_open "${CLUSTER_PORTS[$n - 1]}"; then
      any=1
      cluster_ctl "$n" cluster_status
      break
    fi
  done
  [[ $any -eq 1 ]] || return 3
}

cluster_env() {
  printf 'CLUSTER_NODES="%s"\nCLUSTER_PORTS="%s"\nCLUSTER_URLS="%s"\n' \
    "${CLUSTER_NODES[*]}" "${CLUSTER_PORTS[*]}" "${CLUSTER_URLS[*]}"
}

_cluster_main() {
  local cmd=${1:-}
  shift || true
  case "$cmd" in
    up) cluster_up ;;
    down) cluster_down ;;
    status) cluster_status ;;
    ctl) cluster_ctl "$@" ;;
    kill) cluster_kill "${1:-}" ;;
    start) cluster_start "${1:-}" ;;
    stop) cluster_stop "${1:-}" ;;
    pid) cluster_pid "${1:-}" ;;
    wipe) cluster_wipe ;;
    env) cluster_env ;;
    *)
      sed -n '/^# As a command:/,/^# Sourced/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  _cluster_main "$@"
  exit 0 # never read further: the file may be edited while a command runs
fi
