#!/usr/bin/env bash
# A local three-node RabbitMQ cluster on this one host, in the chroot of
# scripts/lib/rabbitmq4.sh (made there on first use), beside the system 3.10
# node (5672) and the single 4.x nodes (5673, 5674). ORDER_EXPIRY_RMQ4_SUITE
# picks the broker, as for rabbitmq4.sh; each suite's cluster has its own names
# and ports, so the two could run side by side:
#
#   suite            RabbitMQ        node N (1-3)          AMQP       distribution
#   forky (or sid)   4.3.x, Khepri   rabbit43cN@localhost  5695-5697  25695-25697
#   trixie (default) 4.0.x, Mnesia   rabbit4cN@localhost   5691-5693  25691-25693
#
# scripts/test runs the cluster stage on forky (4.3). Same Erlang cookie and
# epmd as the suite's single node (4370 trixie, 4371 forky), its own data under
# /srv/order-expiry/NAME in the chroot; +S 1:1 and a 1 GB absolute memory
# watermark per node (see rabbitmq4.sh).
#
# Khepri (4.3: the only metadata store, a Raft cluster of the three nodes)
# changes less here than one might fear; measured on 4.3.6 on 2026-12-02:
# - Forming is as with Mnesia: start three nodes, then on 2 and 3 stop_app,
#   reset, join_cluster rabbit43c1@localhost, start_app. `up` takes 46-58 s
#   (4.0: ~20 s).
# - stop N / kill -9 N with the other two running: the two keep their
#   majority; `start N` boots it from its data dir and it catches up, 27-28 s
#   (no join: it is still a member; no forget_cluster_node either, which only
#   a node removed for good would need, from a node of the majority).
# - After a full stop the three must come back together (as with Mnesia, for
#   another reason): a node booting alone waits for a Khepri leader, which
#   needs a second member. Measured: `start 1` after `down` was not up after
#   90 s; `start 2` then had both up 12 s later. `up` starts all three at once.
# - Without a majority (one node of three) declares, bindings and policies
#   time out; so does every confirm for a quorum queue (tests/cluster,
#   minority.rs).
#
# As a command:
#   scripts/lib/cluster.sh up            start the three nodes (together), join 2 and
#                                        3 to 1 when not yet members, enable all
#                                        feature flags, wait for 3 running nodes;
#                                        a paused node is continued first
#   scripts/lib/cluster.sh down          graceful stop of all three (data kept); the
#                                        chroot's /proc is unmounted when no node of
#                                        that chroot runs
#   scripts/lib/cluster.sh status        each node's state, pid, RSS; cluster_status
#   scripts/lib/cluster.sh ctl N ARGS... rabbitmqctl -n NODE_N ARGS...;
#                                        ctl N queues|diagnostics|... ARGS... as rabbitmq4.sh
#   scripts/lib/cluster.sh kill N        kill -9 of node N's beam only
#   scripts/lib/cluster.sh pause N       SIGSTOP of node N's beam only (found as for
#                                        kill): hung, not dead; its sockets stay open
#   scripts/lib/cluster.sh resume N      SIGCONT of it
#   scripts/lib/cluster.sh stop N        graceful stop of node N (rabbitmqctl stop: the
#                                        whole node, not just the app); continued first
#                                        if paused
#   scripts/lib/cluster.sh start N       bring node N back; it rejoins from its data dir
#                                        (joined afresh if its data was wiped). With both
#                                        other nodes down, use `up` instead (see above)
#   scripts/lib/cluster.sh cut A B       a network partition between nodes A and B: their
#                                        distribution packets dropped, both ways (nftables);
#                                        AMQP and the CLI still reach both
#   scripts/lib/cluster.sh isolate N [--amqp]
#                                        cut node N from the other two; with --amqp, also
#                                        drop every AMQP packet to and from it (no client
#                                        reaches it either)
#   scripts/lib/cluster.sh heal          remove every cut
#   scripts/lib/cluster.sh cuts          list the cuts in force
#   scripts/lib/cluster.sh wipe          down, then delete the three nodes' data
#   scripts/lib/cluster.sh env           print CLUSTER_* for eval
#
# Sourced: defines cluster_up, cluster_down, cluster_status, cluster_ctl N ...,
# cluster_kill N, cluster_pause N, cluster_resume N, cluster_stop N,
# cluster_start N, cluster_cut A B, cluster_isolate N [--amqp], cluster_heal,
# cluster_wipe, cluster_pid N, and CLUSTER_NAME (rabbit43c or
# rabbit4c), CLUSTER_NODES (array of node names), CLUSTER_PORTS (AMQP ports),
# CLUSTER_URLS (amqp://guest:guest@127.0.0.1:PORT/%2f). Like rabbitmq4.sh it
# changes no shell option of the caller and calls `die` (exit) on failure.
#
# Quorum queue placement: a quorum queue declared through node N gets its
# leader on N by default (queue_leader_locator client-local).
# x-queue-leader-locator = balanced (or the queue_leader_locator policy key /
# config setting) spreads leaders over the members instead; it is supported
# since RabbitMQ 3.10 (client-local | balanced) and works on 4.0.5 and 4.3.6:
# six quorum queues declared through node 1 with it got leaders 2/2/2 on the
# three nodes, while six without it all had their leader on node 1.

# Partitions. All three nodes share 127.0.0.1 and the host's epmd, and a node
# dials a peer from an ephemeral port, so a port alone cannot tell which node
# sent a packet. Each node therefore dials its peers from an address of its
# own (CLUSTER_DIAL_FROM: node N from 127.0.0.N+1, all loopback on Linux;
# -kernel inet_dist_connect_options), while listening on 127.0.0.1:DIST as
# before. A connection from node A to node B is then exactly the packets from
# A's address to B's distribution port and from B's port back to A's address:
# `cut A B` drops those and the reverse pair in an nftables table of its own
# (inet order_expiry_cluster), on the output hook, which every loopback packet
# passes. Dropped, not rejected: as on a real network, the peers notice only
# when net_ticktime passes without a tick (10 s in deploy/rabbitmq/
# advanced.config: 7.5-12.5 s), and a new connection attempt hangs until
# net_setuptime. epmd (its own port) and the CLI (which dials from 127.0.0.1)
# are not cut, so each side can still be asked what it sees. `heal` deletes the
# table; the nodes reconnect at their next attempt.
#
# Measured on 4.3.6 (docs/src/results/partitions.md): with node N isolated,
# both sides drop their distribution links to the other within net_ticktime
# (10.8-13.1 s), and link again about 1 s after the heal.

_cluster_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/rabbitmq4.sh
source "$_cluster_lib_dir/rabbitmq4.sh"
# Each suite's cluster has its own names and ports, so the 4.0 and the 4.3
# cluster could run side by side (each in its own chroot, own epmd, cookie).
case $RMQ4_SUITE in
  trixie)
    CLUSTER_NAME=rabbit4c
    CLUSTER_PORTS=(5691 5692 5693)
    CLUSTER_DIST_PORTS=(25691 25692 25693)
    ;;
  *)
    CLUSTER_NAME=rabbit43c
    CLUSTER_PORTS=(5695 5696 5697)
    CLUSTER_DIST_PORTS=(25695 25696 25697)
    ;;
esac
CLUSTER_DIAL_FROM=(127.0.0.2 127.0.0.3 127.0.0.4)
CLUSTER_NODES=("${CLUSTER_NAME}1@localhost" "${CLUSTER_NAME}2@localhost" "${CLUSTER_NAME}3@localhost")
CLUSTER_URLS=(
  "amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[0]}/%2f"
  "amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[1]}/%2f"
  "amqp://guest:guest@127.0.0.1:${CLUSTER_PORTS[2]}/%2f"
)

# _cluster_node N: sets _name, _amqp, _dist, _from for node N (1..3).
_cluster_node() {
  [[ "${1:-}" =~ ^[123]$ ]] || die "cluster node must be 1, 2 or 3, not '${1:-}'"
  _name=$CLUSTER_NAME$1
  _amqp=${CLUSTER_PORTS[$1 - 1]}
  _dist=${CLUSTER_DIST_PORTS[$1 - 1]}
  _from=${CLUSTER_DIAL_FROM[$1 - 1]}
}

cluster_ctl() {
  local _name _amqp _dist _from
  _cluster_node "${1:-}"
  shift
  rmq4_node_ctl "$_name" "$@"
}

cluster_pid() {
  local _name _amqp _dist _from
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
  local t0=$SECONDS n _name _amqp _dist _from
  rmq4_prepare
  _cluster_resume_paused
  # All three at once: after a full stop each node waits for its peers' tables.
  for n in 1 2 3; do
    _cluster_node "$n"
    rmq4_node_ensure_launched "$_name" "$_amqp" "$_dist" "$_from"
  done
  for n in 1 2 3; do
    _cluster_node "$n"
    rmq4_node_wait "$_name" "$_amqp"
  done
  _cluster_join 2
  _cluster_join 3
  _cluster_wait_running 3
  cluster_ctl 1 -q enable_feature_flag all >/dev/null || die "cluster: enable_feature_flag all failed"
  log "cluster up: 3 running RabbitMQ $RMQ4_LABEL nodes on ${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[2]} ($((SECONDS - t0)) s)"
}

cluster_start() {
  local n=${1:-} t0=$SECONDS _name _amqp _dist _from running
  _cluster_node "$n"
  rmq4_prepare
  if cluster_pid "$n" >/dev/null; then cluster_resume "$n"; fi
  rmq4_node_ensure_launched "$_name" "$_amqp" "$_dist" "$_from"
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
  local _name _amqp _dist _from pid
  _cluster_node "${1:-}"
  if pid=$(rmq4_node_pid "$_name") && [[ "$(_cluster_proc_state "$pid")" == T ]]; then
    cluster_resume "$1"
  fi
  rmq4_node_stop "$_name"
}

cluster_kill() {
  local _name _amqp _dist _from
  _cluster_node "${1:-}"
  rmq4_node_kill "$_name"
}

# SIGSTOP of node N's beam only (found and verified as for kill): a hung node,
# not a dead one. Its sockets stay open, the kernel still completes TCP
# handshakes on its ports, and nothing answers: no AMQP, no distribution
# traffic (its peers see it go only after net_ticktime: 10 s in the deployed
# advanced.config the nodes run with, 60 s by default), no
# CLI. The beam's helper processes (erl_child_setup, inet_gethost) are left
# alone; they do nothing without it.
cluster_pause() {
  local _name _amqp _dist _from pid
  _cluster_node "${1:-}"
  pid=$(rmq4_node_pid "$_name") || die "$_name@localhost is not running: nothing to pause"
  log "SIGSTOP $_name@localhost (pid $pid)"
  kill -STOP "$pid" || die "cannot stop $pid"
  local t0=$SECONDS
  until [[ "$(_cluster_proc_state "$pid")" == T ]]; do
    [[ $((SECONDS - t0)) -lt 10 ]] || die "$_name@localhost (pid $pid) did not stop"
    sleep 0.05
  done
}

# SIGCONT of node N's beam (a no-op on a running node).
cluster_resume() {
  local _name _amqp _dist _from pid
  _cluster_node "${1:-}"
  pid=$(rmq4_node_pid "$_name") || die "$_name@localhost is not running: nothing to resume"
  [[ "$(_cluster_proc_state "$pid")" == T ]] && log "SIGCONT $_name@localhost (pid $pid)"
  kill -CONT "$pid" || die "cannot continue $pid"
}

# The state letter of PID (R, S, T, ...), from /proc/PID/stat.
_cluster_proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}

# Resumes every paused node: a paused node answers nothing, so neither a
# start, a graceful stop nor a CLI call would ever return.
_cluster_resume_paused() {
  local n pid
  for n in 1 2 3; do
    pid=$(cluster_pid "$n") || continue
    [[ "$(_cluster_proc_state "$pid")" == T ]] && cluster_resume "$n"
  done
  return 0
}

cluster_down() {
  local n
  # Node 1 last: it is the one to boot first should the nodes be started one
  # by one (`up` starts all three together anyway).
  for n in 3 2 1; do cluster_stop "$n"; done
}

# ---------------------------------------------------------------- cuts ----

_CLUSTER_NFT_TABLE="inet order_expiry_cluster"

_cluster_nft_ready() {
  # scripts/test installs it with the other tools (scripts/lib/services.sh).
  command -v nft >/dev/null || die "nft is missing; as root: apt-get install nftables"
  nft add table $_CLUSTER_NFT_TABLE || die "nft: cannot add table $_CLUSTER_NFT_TABLE"
  nft add chain $_CLUSTER_NFT_TABLE output '{ type filter hook output priority 0; policy accept; }' ||
    die "nft: cannot add the output chain"
}

# A partition between nodes A and B: both connections' packets dropped.
cluster_cut() {
  local a=${1:-} b=${2:-} _name _amqp _dist _from from_a dist_a
  [[ $a != "$b" ]] || die "cut: two different nodes, not '$a' and '$b'"
  _cluster_node "$a"
  from_a=$_from dist_a=$_dist
  _cluster_node "$b"
  _cluster_nft_ready
  local rule
  for rule in \
    "ip saddr $from_a tcp dport $_dist" "ip daddr $from_a tcp sport $_dist" \
    "ip saddr $_from tcp dport $dist_a" "ip daddr $_from tcp sport $dist_a"; do
    nft "add rule $_CLUSTER_NFT_TABLE output $rule counter drop comment \"cut $a-$b\"" ||
      die "nft: cannot add '$rule'"
  done
  log "cut: ${CLUSTER_NODES[$a - 1]} <-/-> ${CLUSTER_NODES[$b - 1]}"
}

# Node N cut from both others; with --amqp, no client reaches it either.
cluster_isolate() {
  local n=${1:-} other rule _name _amqp _dist _from
  _cluster_node "$n"
  for other in 1 2 3; do
    [[ $other == "$n" ]] || cluster_cut "$n" "$other"
  done
  if [[ ${2:-} == --amqp ]]; then
    _cluster_node "$n"
    for rule in "tcp dport $_amqp" "tcp sport $_amqp"; do
      nft "add rule $_CLUSTER_NFT_TABLE output $rule counter drop comment \"amqp $n\"" ||
        die "nft: cannot add '$rule'"
    done
    log "cut: every AMQP packet to and from ${CLUSTER_NODES[$n - 1]}"
  elif [[ -n ${2:-} ]]; then
    die "isolate N [--amqp], not '$2'"
  fi
}

# Every cut gone: the nodes reconnect at their next attempt.
cluster_heal() {
  command -v nft >/dev/null || return 0
  if nft list table $_CLUSTER_NFT_TABLE >/dev/null 2>&1; then
    nft delete table $_CLUSTER_NFT_TABLE || die "nft: cannot delete table $_CLUSTER_NFT_TABLE"
    log "healed: every cut removed"
  fi
}

# The cuts in force, one rule a line with its packet count.
cluster_cuts() {
  command -v nft >/dev/null || return 0
  nft list chain $_CLUSTER_NFT_TABLE output 2>/dev/null | grep -E 'drop' | sed 's/^[[:space:]]*//'
  return 0
}

cluster_wipe() {
  local n
  cluster_down
  for n in 1 2 3; do
    log "deleting the data of ${CLUSTER_NODES[$n - 1]}"
    rm -rf --one-file-system "${RMQ4_ROOT:?}$RMQ4_DATA/$CLUSTER_NAME$n"
  done
}

cluster_status() {
  local n _name _amqp _dist _from any=0
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
    pause) cluster_pause "${1:-}" ;;
    resume) cluster_resume "${1:-}" ;;
    cut) cluster_cut "${1:-}" "${2:-}" ;;
    isolate) cluster_isolate "${1:-}" "${2:-}" ;;
    heal) cluster_heal ;;
    cuts) cluster_cuts ;;
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
