# Sourced by scripts/test and scripts/demo: make sure RabbitMQ and PostgreSQL run
# on 127.0.0.1, starting them if installed but stopped, installing them with
# apt-get when missing and running as root.

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
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
  if port_open 5672; then return 0; fi
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  log "starting RabbitMQ"
  rabbitmq-server -detached || true
  wait_port 5672 RabbitMQ
  rabbitmqctl await_startup >/dev/null 2>&1 || true
}

ensure_rabbitmq_features() {
  # At-least-once dead-lettering needs the stream_queue feature flag (3.10+).
  rabbitmqctl enable_feature_flag all >/dev/null 2>&1 || true
}

ensure_tools() {
  # The TLS tests generate their CA and certificates with the openssl CLI.
  command -v openssl >/dev/null || apt_install openssl
}

ensure_services() {
  ensure_tools
  ensure_postgres
  ensure_postgres_access
  ensure_rabbitmq
  ensure_rabbitmq_features
}
