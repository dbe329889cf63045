#!/usr/bin/env bash
# A RabbitMQ 4.0.x node beside the system 3.10 one, for tests that need 4.0
# behaviour. Debian trixie's rabbitmq-server (4.0.x on Erlang 27) lives in a
# chroot made once with debootstrap at a fixed path outside the repository:
#
#   ORDER_EXPIRY_RMQ4_ROOT   default /var/lib/order-expiry/rabbitmq4-trixie
#   ORDER_EXPIRY_RMQ4_MIRROR default http://deb.debian.org/debian
#   ORDER_EXPIRY_RMQ4_SCHEDULERS default 1 (Erlang schedulers per node; the
#                            benchmarks give the one node 2, as many as cores)
#
# ORDER_EXPIRY_RMQ4_SUITE picks the broker (the default is trixie: everything
# in this file then reads 4.0 and means it):
#
#   suite            RabbitMQ        chroot (default)                          node               AMQP  dist   epmd  CLI dist
#   trixie (default) 4.0.x, Erl 27   /var/lib/order-expiry/rabbitmq4-trixie   rabbit4@localhost  5673  25673  4370  35700-35799
#   forky            4.3.x, Erl 29   /var/lib/order-expiry/rabbitmq43-forky   rabbit43@localhost 5674  25674  4371  35800-35899
#   sid              4.3.x, Erl 29   /var/lib/order-expiry/rabbitmq43-sid     (as forky: run one of the two at a time)
#
# The two chroots are independent (own cookie, epmd, locks, /proc mount) and
# their nodes run side by side. Export the variable so that the wrappers in
# scripts/lib/rabbitmq4-bin, run by the tests, reach the same node. On 4.3
# Khepri is the only metadata store (khepri_db is a required flag there);
# enable_feature_flag all enables the rest. Bookworm's debootstrap has no
# script for forky: the sid one is used. Apt in a forky/sid chroot ignores
# Release files' Valid-Until (see rabbitmq4_ensure). The 4.3 chroot took 64 s
# to make here.
#
# Needs root, debootstrap (installed with apt-get when missing), chroot, mount,
# flock and setsid; no Docker, no systemd. Making the chroot takes 30-35 s on
# this machine (up to ~3 minutes on a slow mirror), once; a chroot without its
# marker file (an interrupted run) is removed (mounts first) and made anew.
#
# As a command:
#   scripts/lib/rabbitmq4.sh ensure          make the chroot if missing (flock'ed)
#   scripts/lib/rabbitmq4.sh start           start the node (idempotent), wait for it
#   scripts/lib/rabbitmq4.sh stop            graceful stop (rabbitmqctl stop)
#   scripts/lib/rabbitmq4.sh kill            kill -9 this node's beam, nothing else
#   scripts/lib/rabbitmq4.sh restart [--hard] stop (or kill -9 with --hard), start
#   scripts/lib/rabbitmq4.sh status          pid, port, RSS, versions (exit 3 if down)
#   scripts/lib/rabbitmq4.sh pid             the node's beam.smp pid (exit 1 if down)
#   scripts/lib/rabbitmq4.sh ctl ARGS...     rabbitmqctl -n NODE ARGS... in the chroot;
#                ctl queues|diagnostics|plugins|upgrade|streams ARGS... runs
#                rabbitmq-queues, rabbitmq-diagnostics, ... instead
#   scripts/lib/rabbitmq4.sh wipe            stop, delete the node's data
#   scripts/lib/rabbitmq4.sh destroy         stop every 4.0 node, unmount, rm the chroot
#   scripts/lib/rabbitmq4.sh env             print RMQ4_* for eval
#
# Sourced (`source scripts/lib/rabbitmq4.sh`): defines the rabbitmq4_* functions
# above (rabbitmq4_start, rabbitmq4_ctl list_queues -p VHOST name messages, ...),
# the generic rmq4_node_* functions cluster.sh builds on, and these variables:
#   RMQ4_NODE=rabbit4@localhost  RMQ4_AMQP_PORT=5673  RMQ4_DIST_PORT=25673
#   RMQ4_URL=amqp://guest:guest@127.0.0.1:5673/%2f  RMQ4_EPMD_PORT=4370
#   RMQ4_ROOT (the chroot)
# Sourcing changes no shell option (no set -e/-u/pipefail): the functions check
# their own errors, work with or without errexit/nounset in the caller, and
# like services.sh (which it sources for log/die/port_open) call `die`, which
# exits the calling shell, on anything they cannot recover from.
#
# Layout and isolation from the system 3.10 node (rabbit@localhost, 5672,
# 25672, epmd 4369):
# - every 4.0 node runs as root inside the chroot with its own node name,
#   AMQP port, distribution port, config file, enabled_plugins ([] : no
#   management), data and log dirs under /srv/order-expiry/NAME in the chroot
#   (host path $RMQ4_ROOT/srv/order-expiry/NAME);
# - one Erlang cookie for all 4.0 nodes: /srv/order-expiry/home/.erlang.cookie
#   (HOME of the servers and of the CLI), never the system node's;
# - its own epmd on 127.0.0.1:4370 (ERL_EPMD_PORT), started by the first 4.0
#   node in the chroot and stopped with the last. Sharing the system epmd
#   (4369) should work as well (not tried), but would tie the 4.0 nodes to an
#   epmd that belongs to the system service: if it is killed (as some service
#   restarts do) the 4.0 nodes are silently unregistered and no CLI reaches
#   them any more; and `epmd -names` there would mix both worlds;
# - enable_feature_flag all runs after every start; it enables every stable
#   flag (khepri_db, experimental in 4.0, stays disabled: Mnesia it is; on
#   4.3 it is required, always on, and the command succeeds as well);
# - the node's beam is found from its pid file, and is only ever accepted
#   (for kill -9 too) if it is a beam.smp whose root is this chroot and whose
#   environment names this node: the system beam (root /) cannot match;
# - /proc is mounted in the chroot while any 4.0 node runs, and unmounted when
#   the last one stops; destroy unmounts everything below the chroot before
#   rm -rf --one-file-system.

_rmq4_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/services.sh
source "$_rmq4_lib_dir/services.sh"

RMQ4_SUITE=${ORDER_EXPIRY_RMQ4_SUITE:-trixie}
case $RMQ4_SUITE in
  trixie)
    # The default, as before: RabbitMQ 4.0.x.
    _rmq4_default_root=/var/lib/order-expiry/rabbitmq4-trixie
    RMQ4_LABEL=4.0
    RMQ4_EPMD_PORT=4370
    RMQ4_NAME=rabbit4
    RMQ4_AMQP_PORT=5673
    RMQ4_DIST_PORT=25673
    _rmq4_ctl_ports=(35700 35799)
    ;;
  forky | sid)
    # RabbitMQ 4.3.x (Erlang 29): forky, or sid if forky's cannot be
    # installed. Both use the same node name and ports: one at a time.
    _rmq4_default_root=/var/lib/order-expiry/rabbitmq43-$RMQ4_SUITE
    RMQ4_LABEL=4.3
    RMQ4_EPMD_PORT=4371
    RMQ4_NAME=rabbit43
    RMQ4_AMQP_PORT=5674
    RMQ4_DIST_PORT=25674
    _rmq4_ctl_ports=(35800 35899)
    ;;
  *) die "ORDER_EXPIRY_RMQ4_SUITE must be trixie (RabbitMQ 4.0, the default), forky or sid (4.3), not $RMQ4_SUITE" ;;
esac
RMQ4_ROOT=${ORDER_EXPIRY_RMQ4_ROOT:-$_rmq4_default_root}
RMQ4_MIRROR=${ORDER_EXPIRY_RMQ4_MIRROR:-http://deb.debian.org/debian}
RMQ4_NODE=$RMQ4_NAME@localhost
RMQ4_URL="amqp://guest:guest@127.0.0.1:$RMQ4_AMQP_PORT/%2f"
# Inside the chroot.
RMQ4_DATA=/srv/order-expiry
# Seconds a node gets to boot (2 cores, up to 4 nodes booting at once, and a
# clustered node waits for its peers' tables).
RMQ4_START_TIMEOUT=${RMQ4_START_TIMEOUT:-300}
_RMQ4_MARKER=.order-expiry-rabbitmq4-ready

# ---------------------------------------------------------------- chroot ----

rmq4_ready() { [[ -f "$RMQ4_ROOT/$_RMQ4_MARKER" ]]; }

# Pids of every process whose root directory is the chroot.
rmq4_chroot_pids() {
  local p root
  root=$(realpath -m "$RMQ4_ROOT")
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/root" 2>/dev/null)" == "$root" ]] && echo "${p#/proc/}"
  done
  return 0
}

# Mount points at or below the chroot, deepest first.
_rmq4_mounts_below() {
  local root
  root=$(realpath -m "$RMQ4_ROOT")
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

_rmq4_umount_all() {
  local m
  while read -r m; do
    [[ -n "$m" ]] || continue
    umount "$m" 2>/dev/null || umount -l "$m" || die "cannot unmount $m"
  done < <(_rmq4_mounts_below)
}

# Kill whatever still runs inside the chroot (used before removing it).
_rmq4_kill_chroot_procs() {
  local pids
  pids=$(rmq4_chroot_pids)
  [[ -n "$pids" ]] || return 0
  log "killing processes left in $RMQ4_ROOT: ${pids//$'\n'/ }"
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  sleep 1
}

_rmq4_remove_tree() {
  [[ -e "$RMQ4_ROOT" ]] || return 0
  _rmq4_kill_chroot_procs
  _rmq4_umount_all
  rm -rf --one-file-system "$RMQ4_ROOT" || die "cannot remove $RMQ4_ROOT"
  rm -f "$RMQ4_ROOT.mounts.lock"
}

# Make the chroot unless it is complete. Concurrent callers wait on a lock
# beside it; the loser finds the marker and returns.
rabbitmq4_ensure() {
  rmq4_ready && return 0
  [[ $(id -u) -eq 0 ]] || die "making the RabbitMQ $RMQ4_LABEL chroot needs root"
  command -v debootstrap >/dev/null || apt_install debootstrap
  mkdir -p "$(dirname "$RMQ4_ROOT")" || die "cannot create $(dirname "$RMQ4_ROOT")"
  local fd
  exec {fd}>"$RMQ4_ROOT.lock" || die "cannot open $RMQ4_ROOT.lock"
  if ! flock -n "$fd"; then
    log "waiting for another caller making $RMQ4_ROOT"
    flock "$fd" || die "cannot lock $RMQ4_ROOT.lock"
  fi
  if rmq4_ready; then
    exec {fd}>&-
    return 0
  fi
  if [[ -e "$RMQ4_ROOT" ]]; then
    log "removing the half-made chroot $RMQ4_ROOT"
    _rmq4_remove_tree
  fi
  local started=$SECONDS buildlog="$RMQ4_ROOT.build.log"
  log "debootstrap $RMQ4_SUITE into $RMQ4_ROOT (30-35 s here, once; log: $buildlog)"
  : >"$buildlog"
  # Base system first, then rabbitmq-server with a policy-rc.d that forbids
  # maintainer scripts to start services: a postinst must never start a
  # second broker on 5672/4369 beside the system one.
  # A debootstrap older than the suite (bookworm's 1.0.128 knows no forky)
  # has no script for it: Debian's suites all use the sid one.
  local script=()
  [[ -e /usr/share/debootstrap/scripts/$RMQ4_SUITE ]] || script=(/usr/share/debootstrap/scripts/sid)
  if ! debootstrap --variant=minbase "$RMQ4_SUITE" "$RMQ4_ROOT" "$RMQ4_MIRROR" "${script[@]}" >>"$buildlog" 2>&1; then
    tail -20 "$buildlog" >&2
    _rmq4_umount_all
    exec {fd}>&-
    die "debootstrap failed (log: $buildlog)"
  fi
  _rmq4_umount_all # debootstrap leaves none behind on success; be sure
  printf '#!/bin/sh\nexit 101\n' >"$RMQ4_ROOT/usr/sbin/policy-rc.d"
  chmod 755 "$RMQ4_ROOT/usr/sbin/policy-rc.d"
  _rmq4_write_hosts
  if [[ $RMQ4_SUITE != trixie ]]; then
    # A testing or unstable Release file is valid for a week only: apt then
    # refuses a mirror (or a mirror's cache) older than that, which debootstrap
    # accepted ("Release file ... is expired"). The signature is still checked.
    echo 'Acquire::Check-Valid-Until "false";' >"$RMQ4_ROOT/etc/apt/apt.conf.d/99order-expiry-valid-until"
  fi
  mountpoint -q "$RMQ4_ROOT/proc" || mount -t proc proc "$RMQ4_ROOT/proc" || die "cannot mount /proc in $RMQ4_ROOT"
  local ok=1
  chroot "$RMQ4_ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    sh -c 'apt-get update -q && apt-get install -y --no-install-recommends rabbitmq-server && apt-get clean' >>"$buildlog" 2>&1 || ok=0
  _rmq4_kill_chroot_procs # nothing should run; a postinst could have left epmd
  _rmq4_umount_all
  if [[ $ok -ne 1 ]]; then
    tail -20 "$buildlog" >&2
    exec {fd}>&-
    die "installing rabbitmq-server in $RMQ4_ROOT failed (log: $buildlog)"
  fi
  _rmq4_pkg_versions >"$RMQ4_ROOT/$_RMQ4_MARKER"
  exec {fd}>&-
  log "chroot ready in $((SECONDS - started)) s: $(tr '\n' ' ' <"$RMQ4_ROOT/$_RMQ4_MARKER")"
}

_rmq4_pkg_versions() {
  # shellcheck disable=SC2016 # dpkg-query's own ${field} syntax
  chroot "$RMQ4_ROOT" dpkg-query -W -f '${Package} ${Version}\n' rabbitmq-server erlang-base 2>/dev/null
}

# Node names are NAME@localhost; the CLI names itself after the machine's
# hostname: both must resolve inside the chroot.
_rmq4_write_hosts() {
  local h s
  h=$(hostname 2>/dev/null || echo localhost)
  s=$(hostname -s 2>/dev/null || echo "$h")
  printf '127.0.0.1 localhost %s %s\n::1 localhost ip6-localhost ip6-loopback\n' "$h" "$s" >"$RMQ4_ROOT/etc/hosts"
}

_rmq4_mounts_up() {
  mountpoint -q "$RMQ4_ROOT/proc" || mount -t proc proc "$RMQ4_ROOT/proc" || die "cannot mount /proc in $RMQ4_ROOT"
  # debootstrap makes the device nodes (/dev/null, /dev/urandom, ...) that
  # Erlang and the start scripts use; bind the host's /dev only if it did not.
  if [[ ! -c "$RMQ4_ROOT/dev/null" ]] && ! mountpoint -q "$RMQ4_ROOT/dev"; then
    mount --bind /dev "$RMQ4_ROOT/dev" || die "cannot bind /dev into $RMQ4_ROOT"
  fi
}

# When no 4.0 node runs any more: stop the chroot's epmd, unmount. Under the
# mounts lock, which a launch holds until its process is inside the chroot.
_rmq4_mounts_release() {
  local fd p
  [[ -d "$RMQ4_ROOT" ]] || return 0
  exec {fd}>"$RMQ4_ROOT.mounts.lock" || die "cannot open $RMQ4_ROOT.mounts.lock"
  flock "$fd" || die "cannot lock $RMQ4_ROOT.mounts.lock"
  if [[ -z "$(rmq4_running_nodes)" ]]; then
    for p in $(rmq4_chroot_pids); do
      [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == epmd ]] && kill "$p" 2>/dev/null
    done
    sleep 0.2
    # Anything else still in there (a CLI call?) keeps the mounts.
    [[ -n "$(rmq4_chroot_pids)" ]] || _rmq4_umount_all
  fi
  exec {fd}>&-
}

# Make the chroot, the shared cookie/HOME, mounts and hosts ready to run nodes.
rmq4_prepare() {
  rabbitmq4_ensure
  local home="$RMQ4_ROOT$RMQ4_DATA/home"
  mkdir -p "$home" || die "cannot create $home"
  if [[ ! -s "$home/.erlang.cookie" ]]; then
    (umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$home/.erlang.cookie") || die "cannot write the cookie"
  fi
  chmod 400 "$home/.erlang.cookie"
  : >>"$RMQ4_ROOT$RMQ4_DATA/rabbitmq-env.conf"
  _rmq4_write_hosts
}

# Environment shared by servers and CLI tools (inside the chroot).
_rmq4_base_env() {
  _rmq4_env=(
    PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8
    HOME="$RMQ4_DATA/home"
    ERL_EPMD_PORT="$RMQ4_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_CONF_ENV_FILE="$RMQ4_DATA/rabbitmq-env.conf"
    # CLI tools' own distribution ports, away from the system CLI's 35672+.
    RABBITMQ_CTL_DIST_PORT_MIN="${_rmq4_ctl_ports[0]}" RABBITMQ_CTL_DIST_PORT_MAX="${_rmq4_ctl_ports[1]}"
  )
}

# ----------------------------------------------------------------- nodes ----
# Generic: a node is NAME (node NAME@localhost, data in /srv/order-expiry/NAME)
# with an AMQP and a distribution port. cluster.sh uses these too.

_rmq4_node_dir() { echo "$RMQ4_DATA/$1"; }

_rmq4_is_node_pid() { # PID NAME ROOT
  [[ "$1" =~ ^[0-9]+$ ]] || return 1
  [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == beam.smp ]] || return 1
  [[ "$(readlink "/proc/$1/root" 2>/dev/null)" == "$3" ]] || return 1
  grep -qx "ORDER_EXPIRY_RMQ4_INSTANCE=$2" <<<"$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null)"
}

# The pid of NAME's beam.smp, verified: root is the chroot and its environment
# names this node. Exit status 1 (and no output) when it does not run.
rmq4_node_pid() {
  local name=$1 dir pid root
  dir=$RMQ4_ROOT$(_rmq4_node_dir "$name")
  root=$(realpath -m "$RMQ4_ROOT")
  pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
  if [[ -n "$pid" ]] && _rmq4_is_node_pid "$pid" "$name" "$root"; then
    echo "$pid"
    return 0
  fi
  # No pid file yet (early boot) or a stale one: look at the chroot's beams.
  for pid in $(rmq4_chroot_pids); do
    if _rmq4_is_node_pid "$pid" "$name" "$root"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# Names of the 4.0 nodes whose beam runs now.
rmq4_running_nodes() {
  local p
  for p in $(rmq4_chroot_pids); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == beam.smp ]] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^ORDER_EXPIRY_RMQ4_INSTANCE=//p'
  done
  return 0
}

# rmq4_node_ctl NAME [queues|diagnostics|plugins|upgrade|streams] ARGS...
rmq4_node_ctl() {
  local name=$1 tool=rabbitmqctl
  shift
  case "${1:-}" in
    queues | diagnostics | plugins | upgrade | streams) tool=rabbitmq-$1; shift ;;
  esac
  rmq4_ready || die "no RabbitMQ $RMQ4_LABEL chroot at $RMQ4_ROOT (run scripts/lib/rabbitmq4.sh ensure)"
  # No mounting here: /proc is mounted while any node runs, and a CLI call
  # with no node up has nothing to talk to.
  local _rmq4_env
  _rmq4_base_env
  chroot "$RMQ4_ROOT" /usr/bin/env -i "${_rmq4_env[@]}" "/usr/lib/rabbitmq/bin/$tool" -n "$name@localhost" "$@"
}

_rmq4_write_node_config() {
  local name=$1 amqp=$2 dir
  dir=$RMQ4_ROOT$(_rmq4_node_dir "$name")
  mkdir -p "$dir/mnesia" "$dir/log" || die "cannot create $dir"
  # A node that runs a configuration of its own (scripts/lib/deploy-broker.sh
  # boots the deployed one) brings its files; they are kept.
  [[ -f "$dir/.own-config" ]] && return 0
  cat >"$dir/rabbitmq.conf" <<EOF
# Written by scripts/lib/rabbitmq4.sh at every start: edits here are lost.
listeners.tcp.1 = 127.0.0.1:$amqp
# guest may log in from loopback only (the default), and everything here
# connects from 127.0.0.1.
loopback_users.guest = true
# Up to five brokers share this 24 GB, 2-core machine. Not 1GB: a node that
# recovers the fault tests' ballast uses 1.1-1.2 GB while it boots, and its
# memory alarm blocked every publisher for up to 12 s after a restart.
vm_memory_high_watermark.absolute = 2GB
disk_free_limit.absolute = 50MB
log.file.level = info
log.console = false
EOF
  echo '[].' >"$dir/enabled_plugins"
  # The dead-letter retry of deploy/rabbitmq/advanced.config, or RabbitMQ's
  # stock settings (ORDER_EXPIRY_BROKER_SETTINGS, scripts/lib/services.sh).
  broker_advanced_config >"$dir/advanced.config"
}

# Start NAME's beam in the background (detached from the caller's session)
# and return at once; rmq4_node_wait waits for it. DIAL_FROM (optional, an
# address of 127.0.0.0/8) is the source address of the node's outgoing
# distribution connections: scripts/lib/cluster.sh gives each node its own, so
# that a packet filter can tell the nodes apart (its `cut`). Its listener stays
# on 127.0.0.1.
rmq4_node_launch() {
  local name=$1 amqp=$2 dist=$3 dial_from=${4:-} dir hostdir
  dir=$(_rmq4_node_dir "$name")
  hostdir=$RMQ4_ROOT$dir
  if rmq4_node_pid "$name" >/dev/null; then
    return 0
  fi
  port_open "$amqp" && die "port $amqp is taken by something other than $name@localhost"
  port_open "$dist" && die "distribution port $dist is taken by something other than $name@localhost"
  _rmq4_write_node_config "$name" "$amqp"
  rm -f "$hostdir/$name.pid"
  local _rmq4_env _rmq4_sched=${ORDER_EXPIRY_RMQ4_SCHEDULERS:-1}
  [[ $_rmq4_sched =~ ^[1-9][0-9]*$ ]] || die "ORDER_EXPIRY_RMQ4_SCHEDULERS must be a positive number, not $_rmq4_sched"
  _rmq4_base_env
  # One scheduler per node: up to five brokers share 2 cores. A benchmark
  # of the single node sets ORDER_EXPIRY_RMQ4_SCHEDULERS=2, so that it has
  # the cores the system 3.10 node (Erlang's default, one per core) has.
  local erl_args="+S $_rmq4_sched:$_rmq4_sched +SDcpu $_rmq4_sched:$_rmq4_sched -kernel inet_dist_use_interface {127,0,0,1}"
  if [[ -n $dial_from ]]; then
    [[ $dial_from =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "a node dials from a loopback address, not '$dial_from'"
    # rabbitmq-server splits these words unquoted: the term has no spaces,
    # and its [...] globs nothing in the chroot's / (no one-letter names).
    erl_args+=" -kernel inet_dist_connect_options [{ip,{${dial_from//./,}}}]"
  fi
  _rmq4_env+=(
    ORDER_EXPIRY_RMQ4_INSTANCE="$name"
    RABBITMQ_NODENAME="$name@localhost"
    RABBITMQ_DIST_PORT="$dist"
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
    RABBITMQ_MNESIA_BASE="$dir/mnesia"
    RABBITMQ_LOG_BASE="$dir/log"
    RABBITMQ_PID_FILE="$dir/$name.pid"
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$erl_args"
  )
  printf '\n=== %s start %s\n' "$(date -Is)" "$name" >>"$hostdir/console.log"
  # setsid -f: own session, so neither the caller's job control, its process
  # group being killed, nor `wait` in the caller involves the broker.
  setsid -f chroot "$RMQ4_ROOT" /usr/bin/env -i "${_rmq4_env[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server \
    </dev/null >>"$hostdir/console.log" 2>&1 || die "cannot launch $name"
}

# Wait until NAME's AMQP port is open and await_startup returns.
rmq4_node_wait() {
  local name=$1 amqp=$2 hostdir t0=$SECONDS seen=0
  hostdir=$RMQ4_ROOT$(_rmq4_node_dir "$name")
  until port_open "$amqp"; do
    if rmq4_node_pid "$name" >/dev/null; then
      seen=1
    elif [[ $seen -eq 1 || $((SECONDS - t0)) -gt 20 ]]; then
      tail -30 "$hostdir/console.log" >&2
      die "$name@localhost exited while starting (see $hostdir/console.log and $hostdir/log)"
    fi
    [[ $((SECONDS - t0)) -lt $RMQ4_START_TIMEOUT ]] || die "$name@localhost did not open port $amqp within $RMQ4_START_TIMEOUT s"
    sleep 0.5
  done
  rmq4_node_ctl "$name" -q await_startup --timeout "$RMQ4_START_TIMEOUT" >/dev/null ||
    die "$name@localhost: await_startup failed"
}

# Launch NAME unless it runs, under a per-node lock so that concurrent
# callers launch it once; does not wait for it. DIAL_FROM as for
# rmq4_node_launch.
rmq4_node_ensure_launched() {
  local name=$1 amqp=$2 dist=$3 dial_from=${4:-} fd mfd t0
  exec {fd}>"$RMQ4_ROOT$RMQ4_DATA/.$name.lock" || die "cannot open the lock for $name"
  flock "$fd" || die "cannot lock $name"
  if ! rmq4_node_pid "$name" >/dev/null; then
    log "starting RabbitMQ $RMQ4_LABEL node $name@localhost on 127.0.0.1:$amqp"
    exec {mfd}>"$RMQ4_ROOT.mounts.lock" || die "cannot open $RMQ4_ROOT.mounts.lock"
    flock "$mfd" || die "cannot lock $RMQ4_ROOT.mounts.lock"
    _rmq4_mounts_up
    # The broker must not inherit (and so hold) the locks.
    rmq4_node_launch "$name" "$amqp" "$dist" "$dial_from" {fd}>&- {mfd}>&-
    # Keep a concurrent last-node stop from unmounting /proc under us until
    # the new node's processes are inside the chroot.
    t0=$SECONDS
    while [[ -z "$(rmq4_chroot_pids)" && $((SECONDS - t0)) -lt 10 ]]; do sleep 0.05; done
    exec {mfd}>&-
  fi
  exec {fd}>&-
}

# Start NAME (idempotent): launch if not running, wait, enable feature flags.
rmq4_node_start() {
  local name=$1 amqp=$2 dist=$3 t0=$SECONDS
  rmq4_prepare
  rmq4_node_ensure_launched "$name" "$amqp" "$dist"
  rmq4_node_wait "$name" "$amqp"
  rmq4_node_ctl "$name" -q enable_feature_flag all >/dev/null || die "$name@localhost: enable_feature_flag all failed"
  log "$name@localhost up (pid $(rmq4_node_pid "$name"), $((SECONDS - t0)) s)"
}

# Graceful stop of the whole node (rabbitmqctl stop), waiting for the beam to
# exit; kill -9 only if it is still there after 120 s.
rmq4_node_stop() {
  local name=$1 pid
  if ! pid=$(rmq4_node_pid "$name"); then
    _rmq4_mounts_release
    return 0
  fi
  log "stopping $name@localhost (pid $pid)"
  rmq4_node_ctl "$name" -q stop >/dev/null 2>&1 || true
  local t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if [[ $((SECONDS - t0)) -gt 120 ]]; then
      log "$name@localhost still running after 120 s: kill -9 $pid"
      kill -9 "$pid" 2>/dev/null || true
    fi
    sleep 0.3
  done
  _rmq4_mounts_release
}

# kill -9 of NAME's beam and nothing else; returns when it is gone.
rmq4_node_kill() {
  local name=$1 pid
  if ! pid=$(rmq4_node_pid "$name"); then
    log "$name@localhost is not running: nothing to kill"
    return 0
  fi
  log "kill -9 $name@localhost (pid $pid)"
  kill -9 "$pid" || die "cannot kill $pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  return 0
}

rmq4_node_wipe() {
  local name=$1
  rmq4_node_stop "$name"
  log "deleting the data of $name@localhost"
  rm -rf --one-file-system "${RMQ4_ROOT:?}$(_rmq4_node_dir "$name")"
}

# One line per node: name, state, pid, RSS.
rmq4_node_status_line() {
  local name=$1 amqp=$2 pid rss
  if pid=$(rmq4_node_pid "$name"); then
    rss=$(awk '/^VmRSS/ { printf "%d MB", $2 / 1024 }' "/proc/$pid/status" 2>/dev/null)
    if port_open "$amqp"; then
      echo "$name@localhost running pid=$pid amqp=127.0.0.1:$amqp rss=$rss"
    else
      echo "$name@localhost booting pid=$pid amqp=127.0.0.1:$amqp (port not open yet) rss=$rss"
    fi
  else
    echo "$name@localhost stopped amqp=127.0.0.1:$amqp"
  fi
}

# ------------------------------------------------------ the single node ----

rabbitmq4_start() { rmq4_node_start "$RMQ4_NAME" "$RMQ4_AMQP_PORT" "$RMQ4_DIST_PORT"; }
rabbitmq4_stop() { rmq4_node_stop "$RMQ4_NAME"; }
rabbitmq4_kill() { rmq4_node_kill "$RMQ4_NAME"; }
rabbitmq4_pid() { rmq4_node_pid "$RMQ4_NAME"; }
rabbitmq4_ctl() { rmq4_node_ctl "$RMQ4_NAME" "$@"; }
rabbitmq4_wipe() { rmq4_node_wipe "$RMQ4_NAME"; }

# rabbitmq4_restart [--hard]: graceful stop (or kill -9 with --hard), start.
rabbitmq4_restart() {
  if [[ "${1:-}" == --hard ]]; then rabbitmq4_kill; else rabbitmq4_stop; fi
  rabbitmq4_start
}

rabbitmq4_status() {
  if ! rmq4_ready; then
    echo "no chroot at $RMQ4_ROOT (scripts/lib/rabbitmq4.sh ensure makes it)"
    return 1
  fi
  echo "chroot $RMQ4_ROOT: $(tr '\n' ' ' <"$RMQ4_ROOT/$_RMQ4_MARKER")"
  rmq4_node_status_line "$RMQ4_NAME" "$RMQ4_AMQP_PORT"
  rabbitmq4_pid >/dev/null || return 3
  rabbitmq4_ctl -q eval 'io:format("rabbitmq ~s, erlang/otp ~s, erts ~s~n", [element(2, application:get_key(rabbit, vsn)), erlang:system_info(otp_release), erlang:system_info(version)]).' | grep -v '^ok$'
}

# Stop every 4.0 node (the single one and the cluster's), unmount, delete the chroot.
rabbitmq4_destroy() {
  local name
  for name in $(rmq4_running_nodes); do rmq4_node_stop "$name"; done
  log "removing $RMQ4_ROOT"
  _rmq4_remove_tree
  rm -f "$RMQ4_ROOT.lock"
}

rabbitmq4_env() {
  printf 'RMQ4_NODE=%s\nRMQ4_AMQP_PORT=%s\nRMQ4_DIST_PORT=%s\nRMQ4_EPMD_PORT=%s\nRMQ4_URL=%s\nRMQ4_ROOT=%s\n' \
    "$RMQ4_NODE" "$RMQ4_AMQP_PORT" "$RMQ4_DIST_PORT" "$RMQ4_EPMD_PORT" "$RMQ4_URL" "$RMQ4_ROOT"
}

_rmq4_main() {
  local cmd=${1:-}
  shift || true
  case "$cmd" in
    ensure) rabbitmq4_ensure ;;
    start) rabbitmq4_start ;;
    stop) rabbitmq4_stop ;;
    kill) rabbitmq4_kill ;;
    restart) rabbitmq4_restart "$@" ;;
    status) rabbitmq4_status ;;
    pid) rabbitmq4_pid ;;
    ctl) rabbitmq4_ctl "$@" ;;
    wipe) rabbitmq4_wipe ;;
    destroy) rabbitmq4_destroy ;;
    env) rabbitmq4_env ;;
    *)
      sed -n '/^# As a command:/,/^# Sourced/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  _rmq4_main "$@"
  exit 0 # never read further: the file may be edited while a command runs
fi
