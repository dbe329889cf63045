# Sourced by scripts/test and scripts/demo: make sure RabbitMQ and PostgreSQL run
# on 127.0.0.1, starting them if installed but stopped, installing them with
# apt-get when missing and running as root.

log() { printf '\033[1m==> %s %s\033[0m\n' "$(date +%T)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Runs a command that may leave a daemon behind (a broker, epmd, PostgreSQL)
# with every descriptor above stderr closed. scripts/test holds its locks on
# fds 8 and 9 without close-on-exec: a daemon started with them open holds the
# lock for as long as it runs, and every later run waits for it forever (seen:
# a RabbitMQ node restarted by one run held /tmp/order-expiry-services.lock).
without_locks() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    [[ $fd -gt 2 ]] && eval "exec $fd>&-"
  done 2>/dev/null
  "$@"
}

# Daemons (beam.smp, epmd, postgres) that hold one of scripts/test's lock
# files open: "PID COMMAND" per line, nothing when none does.
lock_holding_daemons() {
  local fd target pid cmd
  for fd in /proc/[0-9]*/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    [[ $target == /tmp/order-expiry-*.lock ]] || continue
    pid=${fd#/proc/}
    pid=${pid%%/*}
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-60)
    case "$cmd" in *beam.smp* | *epmd* | *postgres*) echo "$pid $target $cmd" ;; esac
  done | sort -u
}

wait_port() {
  local port=$1 what=$2
  for _ in $(seq 1 60); do
    port_open "$port" && return 0
    sleep 1
  done
  die "$what did not open port $port within 60 s"
}

apt_install() {
  [[ $(id -u) -eq 0 ]] || die "$* missing and not root: install them (apt-get install -y $*) or run as root"
  command -v apt-get >/dev/null || die "$* missing and no apt-get on this machine"
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_postgres() {
  port_open 5432 && return 0
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql
  fi
  log "starting PostgreSQL"
  local version
  version=$(ls /etc/postgresql | sort -V | tail -1)
  (without_locks pg_ctlcluster --skip-systemctl-redirect "$version" main start) || true
  wait_port 5432 PostgreSQL
}

ensure_postgres_access() {
  # The tests connect over TCP as postgres without a password (trust), as the
  # dev machines are set up. A fresh Debian install asks for passwords: allow
  # local trust for the test run, once.
  if ! psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1; then
    local hba
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -1)
    [[ -w "$hba" ]] || die "cannot log in to PostgreSQL as postgres on 127.0.0.1 without a password"
    log "allowing trust auth on 127.0.0.1 in $hba"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    local version
    version=$(basename "$(dirname "$(dirname "$hba")")")
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    sleep 1
  fi
}

ensure_rabbitmq() {
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  ensure_rabbitmq_fd_limit_conf
  ensure_rabbitmq_advanced_config
  if port_open 5672; then return 0; fi
  if rabbitmq_system_pid >/dev/null; then
    # The node runs without its app: another run's fault test may have stopped
    # it for a few seconds; or one was killed before it started it again.
    local _
    for _ in $(seq 1 90); do
      port_open 5672 && return 0
      sleep 1
    done
    log "RabbitMQ's node has run without its app for 90 s: start_app"
    timeout 120 rabbitmqctl -q start_app >/dev/null 2>&1 || restart_rabbitmq
  else
    log "starting RabbitMQ"
    (without_locks rabbitmq-server -detached) || true
  fi
  wait_port 5672 RabbitMQ
  rabbitmqctl await_startup >/dev/null 2>&1 || true
}

# RabbitMQ 3.10's file handle cache reserves about three handles per quorum
# queue against the node's soft open-files limit. Debian's rabbitmq-server
# starts the node through `su`, which sets that limit to 1024: past about 300
# quorum queues (a test run's worlds beside the fault stage's ballast) every
# later declare, vhost change and `rabbitmqctl status` waits for a handle
# forever (seen here: file_handle_cache total_used 927 of 927 with 39 files
# open, add_vhost blocked in rabbit_vhost:recover). rabbitmq-env.conf is
# sourced by the node's start script after `su`: it raises the soft limit to
# the hard one there (20000 here). RabbitMQ 4 has no such cache.
RABBITMQ_ENV_CONF=/etc/rabbitmq/rabbitmq-env.conf
RABBITMQ_FD_MARK='order-expiry (scripts/lib/services.sh)'
ensure_rabbitmq_fd_limit_conf() {
  grep -qF "$RABBITMQ_FD_MARK" "$RABBITMQ_ENV_CONF" 2>/dev/null && return 0
  [[ -w $(dirname "$RABBITMQ_ENV_CONF") ]] || { log "cannot write $RABBITMQ_ENV_CONF: RabbitMQ keeps its open-files limit"; return 0; }
  log "raising RabbitMQ's soft open-files limit to the hard one ($RABBITMQ_ENV_CONF)"
  cat >>"$RABBITMQ_ENV_CONF" <<EOF
# $RABBITMQ_FD_MARK: RabbitMQ 3.10 reserves about three
# file handles per quorum queue against the soft open-files limit; at the
# default 1024 a node stops at about 300 quorum queues and every later
# declare, vhost change or status call hangs. Raise the soft limit to the hard one.
ulimit -S -n "\$(ulimit -H -n)" 2>/dev/null || true
EOF
}

# The broker settings the tests run on, ORDER_EXPIRY_BROKER_SETTINGS:
# - deployed (the default): deploy/rabbitmq/advanced.config, which
#   docker-compose.yml and the RabbitmqCluster ship: a ladder level whose
#   dead-letter worker stalled at boot retries after 5 s;
# - stock: RabbitMQ's defaults (the retry after 180 s), to measure what a
#   broker without that file does (docs/src/results/broker-restarts.md).
# scripts/lib/rabbitmq4.sh writes the same into every 4.0 node's config.
ORDER_EXPIRY_BROKER_SETTINGS=${ORDER_EXPIRY_BROKER_SETTINGS:-deployed}
_services_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEPLOYED_ADVANCED_CONFIG=$_services_repo/deploy/rabbitmq/advanced.config
RABBITMQ_ADVANCED_CONFIG=/etc/rabbitmq/advanced.config

# advanced.config for a node: the deployed file, or `[].` for stock settings.
broker_advanced_config() {
  case $ORDER_EXPIRY_BROKER_SETTINGS in
    deployed) cat "$DEPLOYED_ADVANCED_CONFIG" ;;
    stock) echo '[].' ;;
    *) die "ORDER_EXPIRY_BROKER_SETTINGS must be deployed or stock, not $ORDER_EXPIRY_BROKER_SETTINGS" ;;
  esac
}

# What `rabbitmqctl eval` of the dead-letter retry says on a node that runs
# the wanted settings: {ok,5000} (deployed) or {ok,180000} (stock: the rabbit
# application's own default, on 3.10 and 4.0 alike).
broker_dead_letter_retry_wanted() {
  case $ORDER_EXPIRY_BROKER_SETTINGS in
    deployed) echo "{ok,$(grep -o 'dead_letter_worker_publisher_confirm_timeout, *[0-9]*' "$DEPLOYED_ADVANCED_CONFIG" | grep -o '[0-9]*$')}" ;;
    *) echo "{ok,180000}" ;;
  esac
}

# What the node `rabbitmqctl` (from PATH) reaches runs with.
broker_dead_letter_retry() {
  timeout 60 rabbitmqctl -q eval 'application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).' 2>/dev/null
}

# The system node's /etc/rabbitmq/advanced.config, for the wanted settings; a
# file this script did not write is left alone (the tests then read what the
# node runs with and hold it to that: tests/faults/broker_restart.rs).
ensure_rabbitmq_advanced_config() {
  local mark="%% $RABBITMQ_FD_MARK: ORDER_EXPIRY_BROKER_SETTINGS=$ORDER_EXPIRY_BROKER_SETTINGS"
  if [[ -f $RABBITMQ_ADVANCED_CONFIG ]] && ! grep -qF "%% $RABBITMQ_FD_MARK" "$RABBITMQ_ADVANCED_CONFIG"; then
    log "$RABBITMQ_ADVANCED_CONFIG was not written by scripts/test: left as it is"
    return 0
  fi
  grep -qxF "$mark" "$RABBITMQ_ADVANCED_CONFIG" 2>/dev/null && return 0
  [[ -w $(dirname "$RABBITMQ_ADVANCED_CONFIG") ]] || { log "cannot write $RABBITMQ_ADVANCED_CONFIG: RabbitMQ keeps its settings"; return 0; }
  log "RabbitMQ's $RABBITMQ_ADVANCED_CONFIG: $ORDER_EXPIRY_BROKER_SETTINGS settings"
  { echo "$mark"; broker_advanced_config; } >"$RABBITMQ_ADVANCED_CONFIG.new"
  chmod 644 "$RABBITMQ_ADVANCED_CONFIG.new"
  mv "$RABBITMQ_ADVANCED_CONFIG.new" "$RABBITMQ_ADVANCED_CONFIG"
}

# The running system node's soft open-files limit.
rabbitmq_fd_limit() {
  local pid
  pid=$(rabbitmq_system_pid) || return 1
  awk '/^Max open files/ { print $4 }' "/proc/$pid/limits"
}

ensure_rabbitmq_features() {
  # At-least-once dead-lettering needs the stream_queue feature flag (3.10+).
  rabbitmqctl enable_feature_flag all >/dev/null 2>&1 || true
}

# A node can take connections and still not do its work; then every test run
# against it hangs until CI's limit (seen: a 3.10 node wedged on deleting a
# vhost whose quorum queues were still going away, under four concurrent runs;
# neither stop_app nor start_app cleared it, a kill -9 and a fresh start did).
# The probe, each step within 60 s: the app runs, no resource alarm, and a
# vhost can be made and deleted. It uses `rabbitmqctl` from PATH, so the same
# probe checks the 4.0 node through scripts/lib/rabbitmq4-bin.
rabbitmq_probe() {
  local alarms
  timeout 60 rabbitmqctl -q await_startup >/dev/null 2>&1 || { echo "the app does not run"; return 1; }
  alarms=$(timeout 60 rabbitmqctl -q eval 'rabbit_alarm:get_alarms().' 2>&1) || { echo "no answer to eval"; return 1; }
  [[ $alarms == "[]" ]] || { echo "alarms: $alarms"; return 1; }
  timeout 60 rabbitmqctl -q add_vhost order-expiry-probe >/dev/null 2>&1 &&
    timeout 60 rabbitmqctl -q delete_vhost order-expiry-probe >/dev/null 2>&1 ||
    { echo "a vhost cannot be made and deleted within 60 s"; return 1; }
}

# The system node's beam, only if it runs in this root (never a 4.0 node's,
# whose root is their chroot).
rabbitmq_system_pid() {
  local pid
  for pid in $(cat /var/lib/rabbitmq/mnesia/*.pid 2>/dev/null) $(pgrep -x beam.smp); do
    [[ -d /proc/$pid && $(readlink "/proc/$pid/root") == / ]] || continue
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- '-s rabbit' || continue
    echo "$pid"
    return 0
  done
  return 1
}

# Stop (or, when that does not finish within 60 s, kill -9) and start the
# system node.
restart_rabbitmq() {
  local pid
  timeout 60 rabbitmqctl -q stop >/dev/null 2>&1 || true
  # `stop` returns while the beam is still exiting: give it 30 s.
  for _ in $(seq 1 60); do
    rabbitmq_system_pid >/dev/null || break
    sleep 0.5
  done
  if pid=$(rabbitmq_system_pid); then
    log "RabbitMQ did not stop: kill -9 $pid"
    kill -9 "$pid" 2>/dev/null || true
    sleep 2
  fi
  (without_locks rabbitmq-server -detached) || true
  wait_port 5672 RabbitMQ
  timeout 120 rabbitmqctl -q await_startup >/dev/null 2>&1 || die "RabbitMQ did not start within 120 s"
}

# Probe the system node; restart it once if the probe fails. Only for a run
# that is alone on the machine (scripts/test calls it holding its lock
# exclusively): others' fault tests stop the node on purpose.
ensure_rabbitmq_healthy() {
  local why limit
  limit=$(rabbitmq_fd_limit) || limit=
  if [[ -n $limit && $limit -lt 4096 ]]; then
    log "RabbitMQ on 5672 runs with an open-files limit of $limit: restarting it with the raised limit"
    restart_rabbitmq
  fi
  local retry wanted
  retry=$(broker_dead_letter_retry) || retry="no answer"
  wanted=$(broker_dead_letter_retry_wanted)
  if [[ $retry != "$wanted" ]] && grep -qF "%% $RABBITMQ_FD_MARK" "$RABBITMQ_ADVANCED_CONFIG" 2>/dev/null; then
    log "RabbitMQ on 5672 runs with dead_letter_worker_publisher_confirm_timeout $retry, not $wanted ($ORDER_EXPIRY_BROKER_SETTINGS settings): restarting it"
    restart_rabbitmq
  fi
  why=$(rabbitmq_probe) && return 0
  log "RabbitMQ on 5672 failed its health probe ($why): restarting it"
  restart_rabbitmq
  why=$(rabbitmq_probe) || die "RabbitMQ on 5672 is still unhealthy after a restart: $why"
}

ensure_tools() {
  # The TLS tests generate their CA and certificates with the openssl CLI.
  command -v openssl >/dev/null || apt_install openssl
  # The clock tests run serve with its clock moved by libfaketime.
  [[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]] || apt_install faketime
  # The partition tests cut links between cluster nodes with nft
  # (scripts/lib/cluster.sh cut).
  command -v nft >/dev/null || apt_install nftables
}

ensure_services() {
  ensure_tools
  ensure_postgres
  ensure_postgres_access
  ensure_rabbitmq
  ensure_rabbitmq_features
}
