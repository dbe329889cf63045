#!/usr/bin/env bash
# Boots the broker configuration that docker-compose.yml deploys on a real
# RabbitMQ 4.3 node, the version compose and the RabbitmqCluster pin
# (ORDER_EXPIRY_RMQ4_SUITE, default forky here; trixie boots it on 4.0 by
# hand, ports 5694, 25694, 15694, 15695 below instead of 5704, 25704, 15704,
# 15705), and checks that it does what the files promise. Docker
# cannot run here, so scripts/check-deploy can only read these files; this
# runs them:
#   deploy/rabbitmq.conf, deploy/enabled_plugins, deploy/rabbitmq/advanced.config,
#   definitions.json and deploy/rabbitmq/20-dev-users.json (load_definitions, in
#   file-name order, as compose mounts them).
#
# The node rabbit4deploy@localhost runs in the chroot of scripts/lib/rabbitmq4.sh
# with those files unchanged but for the ports (AMQP 5704, management 15704,
# Prometheus 15705 on 4.3: the system and 4.x test nodes own the defaults), the
# definitions directory's path, and logging to a file. Its data is wiped before
# and after, so every boot is a first boot, as `docker compose up` on a new
# volume is.
#
# Checks (each failure names what the files promised):
#   - the node boots with the files; the management and Prometheus plugins run;
#   - advanced.config: dead_letter_worker_publisher_confirm_timeout is 5000;
#   - definitions.json: every queue it names exists, as quorum, in vhost
#     order-expiry, with exactly the arguments the file declares (dead-letter
#     exchange and strategy, TTL, overflow, leader locator, group size); the
#     delivery-limit policy applies to the due and parked queues;
#   - the dev users log in with their documented passwords: the publisher
#     schedules an order through the ladder, and it reaches the due queue no
#     earlier than its delay; the consumer reads the parked queue;
#   - the same after a restart (definitions are imported at every boot; the users
#     file must come after definitions.json or the users would be locked out);
#   - /metrics on the Prometheus port carries per-queue series of orders.due.
#
#   scripts/lib/deploy-broker.sh [BINARY]   BINARY: order-expiry (default
#                                           target/debug/order-expiry, built if missing)
set -euo pipefail
cd "$(dirname "$0")/../.."
export ORDER_EXPIRY_RMQ4_SUITE=${ORDER_EXPIRY_RMQ4_SUITE:-forky}
# shellcheck source=scripts/lib/rabbitmq4.sh
source scripts/lib/rabbitmq4.sh

name=rabbit4deploy
amqp=5694
dist=25694
mgmt=15694
prom=15695
# On the RabbitMQ 4.3 chroot (ORDER_EXPIRY_RMQ4_SUITE=forky or sid): ports of
# its own, so that it can run beside a 4.0 check.
if [[ $RMQ4_SUITE != trixie ]]; then
  amqp=5704
  dist=25704
  mgmt=15704
  prom=15705
fi
binary=${1:-target/debug/order-expiry}
[[ -x $binary ]] || cargo build --quiet --bin order-expiry
vhost=order-expiry
dir=$RMQ4_DATA/$name
hostdir=$RMQ4_ROOT$dir

fail() {
  printf 'deploy broker: FAILED: %s\n' "$*" >&2
  tail -20 "$hostdir/log/"*.log >&2 2>/dev/null || true
  rmq4_node_wipe "$name" >/dev/null 2>&1 || true
  exit 1
}
ok() { printf 'deploy broker: ok: %s\n' "$*" >&2; }
ctl() { rmq4_node_ctl "$name" "$@"; }

# The deployed files, with the ports and paths this host needs.
prepare() {
  rmq4_prepare
  rmq4_node_wipe "$name" >/dev/null 2>&1 || true
  mkdir -p "$hostdir/mnesia" "$hostdir/log" "$hostdir/definitions"
  sed -e "s|^listeners.tcp.default = .*|listeners.tcp.default = 127.0.0.1:$amqp|" \
    -e "s|^management.tcp.port = .*|management.tcp.port = $mgmt\nmanagement.tcp.ip = 127.0.0.1|" \
    -e "s|^prometheus.tcp.port = .*|prometheus.tcp.port = $prom\nprometheus.tcp.ip = 127.0.0.1|" \
    -e "s|^load_definitions = .*|load_definitions = $dir/definitions|" \
    -e "s|^log.console = .*|log.console = false|" \
    -e "s|^log.file = .*|log.file.level = info|" \
    deploy/rabbitmq.conf >"$hostdir/rabbitmq.conf"
  # The keys rewritten above must still be there, or the node would use the files' own ports.
  for key in listeners.tcp.default management.tcp.port prometheus.tcp.port load_definitions; do
    grep -q "^$key = " deploy/rabbitmq.conf || fail "deploy/rabbitmq.conf no longer sets $key (update this script)"
  done
  cp deploy/enabled_plugins "$hostdir/enabled_plugins"
  cp deploy/rabbitmq/advanced.config "$hostdir/advanced.config"
  cp definitions.json "$hostdir/definitions/10-definitions.json"
  cp deploy/rabbitmq/20-dev-users.json "$hostdir/definitions/20-dev-users.json"
  touch "$hostdir/.own-config"
}

boot() {
  local t0=$SECONDS
  rmq4_node_ensure_launched "$name" "$amqp" "$dist"
  rmq4_node_wait "$name" "$amqp"
  ok "booted with the deployed files in $((SECONDS - t0)) s"
}

check_config() {
  local got
  got=$(ctl -q eval 'application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).')
  [[ $got == "{ok,5000}" ]] || fail "advanced.config: dead_letter_worker_publisher_confirm_timeout is $got, not {ok,5000}"
  ok "advanced.config: dead_letter_worker_publisher_confirm_timeout $got"
  for plugin in rabbitmq_management rabbitmq_prometheus; do
    ctl -q eval "lists:keymember($plugin, 1, application:which_applications())." | grep -qx true ||
      fail "enabled_plugins: $plugin does not run"
  done
  ok "plugins rabbitmq_management and rabbitmq_prometheus run"
}

check_definitions() {
  local want have missing queue
  want=$(python3 -c 'import json,sys; d=json.load(open("definitions.json")); print("\n".join(sorted(q["name"] for q in d["queues"])))')
  have=$(ctl -q list_queues -p "$vhost" name type policy --no-table-headers | sort)
  missing=0
  for queue in $want; do
    grep -q "^$queue[[:space:]]*quorum" <<<"$have" || { echo "missing or not quorum: $queue" >&2; missing=1; }
  done
  [[ $missing -eq 0 ]] || fail "definitions.json: queues not imported as declared"
  for queue in orders.due orders.parked; do
    grep -q "^$queue[[:space:]]*quorum[[:space:]]*orders.delivery-limit" <<<"$have" ||
      fail "definitions.json: policy orders.delivery-limit does not apply to $queue: $(grep "^$queue" <<<"$have")"
  done
  check_queue_arguments
  ok "definitions.json: $(wc -w <<<"$want") quorum queues in vhost $vhost, each with its declared arguments; orders.delivery-limit on due and parked"
}

# Every imported queue carries exactly the arguments definitions.json gives
# it: an import that dropped or changed one (a TTL, the dead-letter target or
# strategy, the leader locator) would still list the queue as quorum.
check_queue_arguments() {
  local listed diff
  listed=$(ctl -q list_queues -p "$vhost" name arguments --formatter json) ||
    fail "list_queues name arguments failed"
  diff=$(python3 -c '
import json, sys
declared = {q["name"]: q["arguments"] for q in json.load(open("definitions.json"))["queues"]}
# rabbitmqctl lists each argument as a [name, type, value] triple.
listed = {q["name"]: {a[0]: a[2] for a in q["arguments"]} for q in json.loads(sys.argv[1])}
for name, arguments in sorted(declared.items()):
    got = listed.get(name)
    if got != arguments:
        print(f"{name}: declared {json.dumps(arguments, sort_keys=True)}, imported {json.dumps(got, sort_keys=True)}")
' "$listed") || fail "cannot compare the queues' arguments"
  [[ -z $diff ]] || fail "definitions.json: queues imported with other arguments:"$'\n'"$diff"
}

# The publisher schedules one order with a 3 s delay. The ladder counts whole
# seconds and delivers up to publisher.lead_ms (300 ms) early, which the
# consumer holds until due: so the order must reach the due queue no earlier
# than 1.7 s after the command started (due_at is taken after that), and within
# 1.5 s of its due time. The depth is read with `order-expiry status --json` as
# the consumer user (a passive declare: exact, where list_queues lags by its
# statistics interval).
due_ready() {
  ORDER_EXPIRY__AMQP__URL="amqp://order-expiry-consumer:consumer-dev@127.0.0.1:$amqp/$vhost" \
    ORDER_EXPIRY__DATABASE__URL=postgres://nobody@127.0.0.1:1/none \
    "$binary" status --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["due"]["ready"] or 0)'
}

check_users() {
  local order=$1 t0 waited
  t0=$(date +%s.%N)
  ORDER_EXPIRY__AMQP__URL="amqp://order-expiry-publisher:publisher-dev@127.0.0.1:$amqp/$vhost" \
    "$binary" schedule --order-id "$order" --delay 3s >/dev/null ||
    fail "order-expiry-publisher (password publisher-dev) cannot schedule"
  until [[ $(due_ready) -ge 1 ]]; do
    awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { exit !(now - t0 > 4.5) }' &&
      fail "order $order scheduled for 3 s is not in orders.due after 4.5 s"
    sleep 0.05
  done
  waited=$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { printf "%.2f", now - t0 }')
  awk -v w="$waited" 'BEGIN { exit !(w >= 1.7) }' || fail "order $order reached orders.due after $waited s: too early for a 3 s delay"
  ok "order-expiry-publisher scheduled $order; in orders.due after $waited s (delay 3 s); order-expiry-consumer reads it"
  ORDER_EXPIRY__AMQP__URL="amqp://order-expiry-consumer:consumer-dev@127.0.0.1:$amqp/$vhost" \
    "$binary" parked list >/dev/null ||
    fail "order-expiry-consumer (password consumer-dev) cannot read orders.parked"
  ok "order-expiry-consumer reads orders.parked"
  ctl -q purge_queue -p "$vhost" orders.due >/dev/null
}

# Queue series appear once the node has emitted its first statistics (every
# 5 s by default): up to 20 s.
check_metrics() {
  local t0=$SECONDS
  until curl -fsS "http://127.0.0.1:$prom/metrics" | grep -c 'queue="orders.due"' >/dev/null; do
    [[ $((SECONDS - t0)) -lt 20 ]] ||
      fail "Prometheus /metrics on $prom has no series for queue orders.due (prometheus.return_per_object_metrics)"
    sleep 1
  done
  ok "Prometheus /metrics carries per-queue series of orders.due"
}

prepare
boot
check_config
check_definitions
check_users deploy-check-1
check_metrics
log "restarting $name@localhost: definitions are imported again at boot"
rmq4_node_stop "$name"
boot
check_definitions
check_users deploy-check-2
rmq4_node_wipe "$name" >/dev/null
ok "all checks passed; $name@localhost stopped and wiped"
