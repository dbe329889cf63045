#!/usr/bin/env bash
# A PostgreSQL primary and its streaming standby on this host, for the failover
# tests (tests/faults/failover): two clusters of their own beside the system
# cluster 15/main on 5432, which every other test uses and which this script
# never touches. A failover test kills, stops, fences and promotes these two;
# with the system cluster in the pair it would demote the database of every
# other test on the machine, and put it back only by a rebuild.
#
#   node  cluster           port  role after `up`
#   1     15/failover1      5433  primary (read-write)
#   2     15/failover2      5434  hot standby, streaming from node 1
#
# Made with pg_createcluster (start.conf manual: nothing starts them at boot),
# node 2's data from `pg_basebackup -R` of node 1. Trust for 127.0.0.1 only,
# replication included; every connection stays on 127.0.0.1. Database
# `order_expiry_failover` (PG_PAIR_DATABASE) on node 1, replicated to node 2.
#
# As a command:
#   scripts/lib/pg-pair.sh up [sync|async]  make the pair if missing (apt-get install
#                                    postgresql when there is none) and bring it to
#                                    its start state: node 1 a writable primary with
#                                    a fresh empty database, node 2 a standby
#                                    streaming from it (rebuilt from a new base
#                                    backup unless it already streams), replication
#                                    synchronous (default: synchronous_standby_names
#                                    names node 2) or asynchronous. Idempotent; after
#                                    a failover it rebuilds the pair
#   scripts/lib/pg-pair.sh down      stop both (fast mode)
#   scripts/lib/pg-pair.sh status    each node: running, primary or standby, port;
#                                    node 1's view of its standby
#   scripts/lib/pg-pair.sh kill N    kill -9 of node N's postmaster and every process
#                                    it started, at once: a crashed host
#   scripts/lib/pg-pair.sh stop N    graceful stop (fast: sessions end; a primary
#                                    sends its standby all WAL, the shutdown
#                                    checkpoint included, before it exits)
#   scripts/lib/pg-pair.sh promote N promote standby N; returns once it takes writes
#   scripts/lib/pg-pair.sh switchback  after a failover to node 2: node 1 its
#                                    standby, then a planned switchover back to
#                                    node 1, node 2 its synchronous standby again;
#                                    the data kept. Prints when node 1 took writes
#   scripts/lib/pg-pair.sh fence N   node N refuses writes (default_transaction_read_only
#                                    = on, reloaded): open sessions stay open and
#                                    read-only, as a demoted primary that is still up
#   scripts/lib/pg-pair.sh pause-replication   SIGSTOP of node 1's walsenders: the
#                                    standby receives nothing more (async commits go on,
#                                    synchronous ones wait); resume-replication: SIGCONT
#   scripts/lib/pg-pair.sh drop      down, then pg_dropcluster both
#   scripts/lib/pg-pair.sh env       print PG_PAIR_* for eval
#
# Sourced: defines pg_pair_up, pg_pair_down, ... and PG_PAIR_PORTS,
# PG_PAIR_DATABASE, PG_PAIR_URL. Calls `die` (exit) on failure.

_pg_pair_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/services.sh
source "$_pg_pair_lib_dir/services.sh"

PG_PAIR_VERSION=${PG_PAIR_VERSION:-15}
PG_PAIR_NAMES=(failover1 failover2)
PG_PAIR_PORTS=(5433 5434)
PG_PAIR_DATABASE=order_expiry_failover
# What the services use: both hosts, the writable one wins.
PG_PAIR_URL="postgres://postgres@127.0.0.1:${PG_PAIR_PORTS[0]},127.0.0.1:${PG_PAIR_PORTS[1]}/$PG_PAIR_DATABASE?target_session_attrs=read-write"

_pg_pair_node() { # N: sets _name, _port, _conf, _data for node N
  [[ "${1:-}" =~ ^[12]$ ]] || die "pg-pair node must be 1 or 2, not '${1:-}'"
  _name=${PG_PAIR_NAMES[$1 - 1]}
  _port=${PG_PAIR_PORTS[$1 - 1]}
  _conf=/etc/postgresql/$PG_PAIR_VERSION/$_name
  _data=/var/lib/postgresql/$PG_PAIR_VERSION/$_name
}

_pg_pair_ctl() { # N ACTION [ARGS]: pg_ctlcluster, no lock descriptor passed on
  local _name _port _conf _data
  _pg_pair_node "$1"
  (without_locks pg_ctlcluster --skip-systemctl-redirect "$PG_PAIR_VERSION" "$_name" "${@:2}")
}

_pg_pair_psql() { # N SQL [DATABASE]: one value per line
  local _name _port _conf _data
  _pg_pair_node "$1"
  psql -h 127.0.0.1 -p "$_port" -U postgres -d "${3:-postgres}" -Atqc "$2"
}

# The postmaster's pid of node N, if it runs.
pg_pair_pid() {
  local _name _port _conf _data pid
  _pg_pair_node "$1"
  [[ -f $_data/postmaster.pid ]] || return 1
  pid=$(head -1 "$_data/postmaster.pid")
  [[ -n $pid && -d /proc/$pid ]] || return 1
  [[ $(tr '\0' ' ' <"/proc/$pid/cmdline") == *"$_data"* ]] || return 1
  echo "$pid"
}

# Waits until node N answers; with `primary`, until it also takes writes.
_pg_pair_wait() { # N [primary]
  local t0=$SECONDS
  while :; do
    case "$(_pg_pair_psql "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null)" in
      f) return 0 ;;
      t) [[ ${2:-} == primary ]] || return 0 ;;
    esac
    [[ $((SECONDS - t0)) -lt 60 ]] || die "pg-pair node $1 did not ${2:+become }${2:-answer} within 60 s"
    sleep 0.1
  done
}

_pg_pair_create() { # N: a new cluster with the pair's settings
  local _name _port _conf _data
  _pg_pair_node "$1"
  [[ -d $_conf ]] && return 0
  log "creating PostgreSQL cluster $PG_PAIR_VERSION/$_name on $_port"
  pg_createcluster --start-conf manual --port "$_port" "$PG_PAIR_VERSION" "$_name" >/dev/null
  cat >"$_conf/pg_hba.conf" <<EOF
# scripts/lib/pg-pair.sh: the failover tests connect over 127.0.0.1 only.
local all         all                trust
host  all         all  127.0.0.1/32  trust
host  replication all  127.0.0.1/32  trust
EOF
  cat >"$_conf/conf.d/50-pair.conf" <<EOF
# scripts/lib/pg-pair.sh: node $1 of the failover pair (either role).
listen_addresses = '127.0.0.1'
port = $_port
shared_buffers = 32MB
max_connections = 60
wal_level = replica
max_wal_senders = 4
hot_standby = on
# The standby reports at once what it flushed, so a synchronous commit waits
# for the standby's disk and no longer.
wal_receiver_status_interval = 1s
EOF
  chown -R postgres:postgres "$_conf"
}

# Node 1's replication mode: synchronous_standby_names names node 2 (each
# commit returns only once node 2 flushed it) or nothing. In node 1's own
# configuration directory: a base backup does not copy it, so a promoted
# node 2 never waits for a standby it does not have.
_pg_pair_replication() { # sync|async
  local _name _port _conf _data file
  _pg_pair_node 1
  file=$_conf/conf.d/60-replication.conf
  case $1 in
    sync) echo "synchronous_standby_names = '${PG_PAIR_NAMES[1]}'" >"$file" ;;
    async) echo "synchronous_standby_names = ''" >"$file" ;;
    *) die "pg-pair replication must be sync or async, not '$1'" ;;
  esac
  chown postgres:postgres "$file"
}

_pg_pair_unfence() { # N
  local _name _port _conf _data
  _pg_pair_node "$1"
  rm -f "$_conf/conf.d/70-fence.conf"
}

# The other node of the pair.
_pg_pair_other() { echo $((3 - $1)); }

# Whether node N streams from the other node now (the other's
# pg_stat_replication), in sync_state STATE if given (sync or async).
_pg_pair_streaming() { # N [STATE]
  local from state
  from=$(_pg_pair_other "${1:-2}")
  state=$(_pg_pair_psql "$from" "SELECT sync_state FROM pg_stat_replication WHERE application_name = '${PG_PAIR_NAMES[${1:-2} - 1]}' AND state = 'streaming'" 2>/dev/null)
  [[ -n $state && ( -z ${2:-} || $state == "$2" ) ]]
}

# Node N's data afresh (default 2): a base backup of the other node, which
# must be the primary (-R: standby.signal and primary_conninfo, named for
# synchronous_standby_names).
_pg_pair_rebuild_standby() { # [N]
  local _name _port _conf _data n=${1:-2} from
  from=$(_pg_pair_other "$n")
  _pg_pair_node "$n"
  _pg_pair_ctl "$n" stop -m immediate >/dev/null 2>&1 || true
  # Emptied, not removed: its parent belongs to root.
  rm -rf --one-file-system "${_data:?}"
  install -d -o postgres -g postgres -m 700 "$_data"
  runuser -u postgres -- pg_basebackup -h 127.0.0.1 -p "${PG_PAIR_PORTS[$from - 1]}" -U postgres \
    -D "$_data" -R -X stream -c fast \
    -d "application_name=$_name" >/dev/null ||
    die "pg_basebackup of node $from into $_data failed"
  # -R wrote the connection pg_basebackup used, application name included;
  # the walreceiver's must be this node's name.
  echo "primary_conninfo = 'host=127.0.0.1 port=${PG_PAIR_PORTS[$from - 1]} user=postgres application_name=$_name'" \
    >>"$_data/postgresql.auto.conf"
  _pg_pair_ctl "$n" start || die "node $n did not start as a standby"
}

pg_pair_up() {
  local mode=${1:-sync} t0=$SECONDS n
  [[ $mode == sync || $mode == async ]] || die "pg-pair up: sync or async, not '$mode'"
  command -v pg_createcluster >/dev/null || apt_install postgresql
  for n in 1 2; do _pg_pair_create "$n"; done
  pg_pair_resume_replication
  _pg_pair_node 1
  # Node 1 runs as a writable primary: not fenced, never a standby.
  _pg_pair_unfence 1
  _pg_pair_unfence 2
  rm -f "$_data/standby.signal"
  # Asynchronous until node 2 streams: a synchronous commit would wait for it.
  _pg_pair_replication async
  if pg_pair_pid 1 >/dev/null; then
    _pg_pair_ctl 1 reload >/dev/null
  else
    _pg_pair_ctl 1 start || die "node 1 did not start"
  fi
  _pg_pair_wait 1 primary
  # Every test starts from an empty database, made on the primary (a standby
  # that streams replays it).
  _pg_pair_psql 1 "DROP DATABASE IF EXISTS $PG_PAIR_DATABASE WITH (FORCE)" >/dev/null 2>&1
  _pg_pair_psql 1 "CREATE DATABASE $PG_PAIR_DATABASE" >/dev/null
  if pg_pair_pid 2 >/dev/null && _pg_pair_streaming 2 &&
    [[ $(_pg_pair_psql 2 'SELECT pg_is_in_recovery()' 2>/dev/null) == t ]]; then
    _pg_pair_ctl 2 reload >/dev/null
  else
    _pg_pair_rebuild_standby
  fi
  _pg_pair_wait 2
  _pg_pair_replication "$mode"
  _pg_pair_ctl 1 reload >/dev/null
  _pg_pair_wait_streaming 2 "$mode"
  log "pg-pair up: node 1 primary on ${PG_PAIR_PORTS[0]}, node 2 $mode standby on ${PG_PAIR_PORTS[1]} ($((SECONDS - t0)) s)"
}

# Waits (at most 90 s) until node N streams from the other node in STATE.
_pg_pair_wait_streaming() { # N sync|async
  local t0=$SECONDS
  until _pg_pair_streaming "$1" "$2"; do
    [[ $((SECONDS - t0)) -lt 90 ]] || die "node $1 does not stream from node $(_pg_pair_other "$1") ($2) after 90 s"
    sleep 0.1
  done
}

# Back to the start state after a failover to node 2, keeping the data: node
# 1 rebuilt as node 2's standby, a planned switchover to it (node 2 stopped
# gracefully, which sends node 1 all its WAL first; node 1 promoted), node 2
# rebuilt as node 1's synchronous standby. Node 1 runs asynchronous from its
# promotion until node 2 streams: synchronous, every commit would wait for a
# standby that is still being copied (as Patroni's non-strict synchronous
# mode does). Prints when node 1 took writes (epoch seconds).
pg_pair_switchback() {
  local t0=$SECONDS promoted
  [[ $(_pg_pair_psql 2 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]] ||
    die "pg-pair switchback: node 2 is not the primary"
  _pg_pair_unfence 1
  _pg_pair_replication async
  if ! { pg_pair_pid 1 >/dev/null && _pg_pair_streaming 1; }; then
    _pg_pair_rebuild_standby 1
  fi
  _pg_pair_wait_streaming 1 async
  _pg_pair_ctl 2 stop -m fast || die "node 2 did not stop"
  pg_pair_promote 1
  promoted=$(date +%s.%N)
  _pg_pair_rebuild_standby 2
  _pg_pair_wait_streaming 2 async
  _pg_pair_replication sync
  _pg_pair_ctl 1 reload >/dev/null
  _pg_pair_wait_streaming 2 sync
  log "pg-pair switchback: node 1 primary again, node 2 its sync standby ($((SECONDS - t0)) s)"
  echo "$promoted"
}

pg_pair_down() {
  local n
  for n in 2 1; do
    pg_pair_pid "$n" >/dev/null || continue
    # A paused walsender would hold the primary's shutdown forever.
    [[ $n == 1 ]] && pg_pair_resume_replication
    _pg_pair_ctl "$n" stop -m fast || _pg_pair_ctl "$n" stop -m immediate || true
  done
}

pg_pair_kill() {
  local pid children
  pid=$(pg_pair_pid "${1:-}") || die "pg-pair node ${1:-} is not running"
  # Every process of the node at once, as a host that dies: children listed
  # before the postmaster goes (they are re-parented after).
  children=$(pgrep -P "$pid" | tr '\n' ' ')
  # shellcheck disable=SC2086
  kill -9 "$pid" $children
  # Its sockets close at once; until its parent reaps it (a second here), its
  # pid still exists and a new postmaster would refuse the data directory.
  for _ in $(seq 1 200); do
    [[ -d /proc/$pid ]] || break
    sleep 0.05
  done
  log "pg-pair node $1 killed (postmaster $pid and ${children:-no children})"
}

pg_pair_stop() {
  pg_pair_pid "${1:-}" >/dev/null || die "pg-pair node ${1:-} is not running"
  [[ $1 == 1 ]] && pg_pair_resume_replication
  _pg_pair_ctl "$1" stop -m fast || die "node $1 did not stop"
}

pg_pair_promote() {
  pg_pair_pid "${1:-}" >/dev/null || die "pg-pair node ${1:-} is not running"
  _pg_pair_ctl "$1" promote >/dev/null || die "node $1 did not promote"
  _pg_pair_wait "$1" primary
}

pg_pair_fence() {
  local _name _port _conf _data
  _pg_pair_node "${1:-}"
  echo "default_transaction_read_only = on" >"$_conf/conf.d/70-fence.conf"
  chown postgres:postgres "$_conf/conf.d/70-fence.conf"
  _pg_pair_ctl "$1" reload >/dev/null || die "node $1 did not reload"
  # A reload reaches each session between statements; a new one is read-only
  # once the postmaster has read the file.
  for _ in $(seq 1 100); do
    [[ $(_pg_pair_psql "$1" 'SHOW transaction_read_only' 2>/dev/null) == on ]] && return 0
    sleep 0.05
  done
  die "node $1 still takes writes 5 s after its fence"
}

# Node 1's walsenders (the processes that stream WAL to node 2).
_pg_pair_walsenders() {
  local pid child
  pid=$(pg_pair_pid 1) || return 0
  for child in $(pgrep -P "$pid"); do
    [[ $(tr '\0' ' ' <"/proc/$child/cmdline" 2>/dev/null) == *walsender* ]] && echo "$child"
  done
  return 0
}

pg_pair_pause_replication() {
  local senders
  senders=$(_pg_pair_walsenders | tr '\n' ' ')
  [[ -n ${senders// /} ]] || die "node 1 has no walsender to pause"
  # shellcheck disable=SC2086
  kill -STOP $senders
}

pg_pair_resume_replication() {
  local senders
  senders=$(_pg_pair_walsenders | tr '\n' ' ')
  # shellcheck disable=SC2086
  [[ -z ${senders// /} ]] || kill -CONT $senders
}

pg_pair_status() {
  local n _name _port _conf _data role
  for n in 1 2; do
    _pg_pair_node "$n"
    if ! pg_pair_pid "$n" >/dev/null; then
      echo "node $n ($PG_PAIR_VERSION/$_name, $_port): down"
      continue
    fi
    case "$(_pg_pair_psql "$n" 'SELECT pg_is_in_recovery()' 2>/dev/null)" in
      f) role=primary ;;
      t) role=standby ;;
      *) role="not answering" ;;
    esac
    [[ $role == primary && $(_pg_pair_psql "$n" 'SHOW transaction_read_only' 2>/dev/null) == on ]] && role="primary, fenced read-only"
    echo "node $n ($PG_PAIR_VERSION/$_name, $_port): $role, pid $(pg_pair_pid "$n")"
  done
  pg_pair_pid 1 >/dev/null &&
    _pg_pair_psql 1 "SELECT 'node 1 streams to ' || application_name || ': ' || state || ', ' || sync_state FROM pg_stat_replication" 2>/dev/null
  return 0
}

pg_pair_drop() {
  local n _name _port _conf _data
  pg_pair_down
  for n in 1 2; do
    _pg_pair_node "$n"
    [[ -d $_conf ]] && pg_dropcluster "$PG_PAIR_VERSION" "$_name"
  done
  return 0
}

pg_pair_env() {
  printf 'PG_PAIR_PORTS="%s"\nPG_PAIR_DATABASE="%s"\nPG_PAIR_URL="%s"\n' \
    "${PG_PAIR_PORTS[*]}" "$PG_PAIR_DATABASE" "$PG_PAIR_URL"
}

_pg_pair_main() {
  local cmd=${1:-}
  shift || true
  case "$cmd" in
    up) pg_pair_up "$@" ;;
    down) pg_pair_down ;;
    status) pg_pair_status ;;
    kill) pg_pair_kill "${1:-}" ;;
    stop) pg_pair_stop "${1:-}" ;;
    promote) pg_pair_promote "${1:-}" ;;
    switchback) pg_pair_switchback ;;
    fence) pg_pair_fence "${1:-}" ;;
    pause-replication) pg_pair_pause_replication ;;
    resume-replication) pg_pair_resume_replication ;;
    pid) pg_pair_pid "${1:-}" ;;
    drop) pg_pair_drop ;;
    env) pg_pair_env ;;
    *)
      sed -n '/^# As a command:/,/^# Sourced/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  _pg_pair_main "$@"
  exit 0 # never read further: the file may be edited while a command runs
fi
