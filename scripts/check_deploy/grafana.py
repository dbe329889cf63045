"""deploy/grafana/order-expiry.json: a well-formed dashboard with a Prometheus
data source and the $vhost/$prefix variables at their defaults, panels for what
ops watch, every query parsed by promtool, and only RabbitMQ metrics the
rabbitmq_prometheus plugin exports.
The order_expiry_* series and labels it queries are checked against the code's
metrics catalog by a Rust test (src/telemetry/catalog.rs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

import yaml

from .common import GRAFANA_DASHBOARD, CheckFailed, check, default_settings, read_text, rel, require, topology_prefix

# Metric names rabbitmq_prometheus exports (all prefixed rabbitmq_), from the
# collector of the 3.10.8 plugin (prometheus_rabbitmq_core_metrics_collector);
# 3.13 keeps them. Per-queue series (with vhost and queue labels) need
# /metrics/per-object or prometheus.return_per_object_metrics = true.
RABBITMQ_PROMETHEUS_METRICS = {"rabbitmq_" + n for n in """
    auth_attempts_detailed_failed_total auth_attempts_detailed_succeeded_total auth_attempts_detailed_total
    auth_attempts_failed_total auth_attempts_succeeded_total auth_attempts_total channel_acks_uncommitted
    channel_consumers channel_get_ack_total channel_get_empty_total channel_get_total channel_messages_acked_total
    channel_messages_confirmed_total channel_messages_delivered_ack_total channel_messages_delivered_total
    channel_messages_published_total channel_messages_redelivered_total channel_messages_unacked
    channel_messages_uncommitted channel_messages_unconfirmed channel_messages_unroutable_dropped_total
    channel_messages_unroutable_returned_total channel_prefetch channel_process_reductions_total
    channels_closed_total channels_opened_total connection_channels connection_incoming_bytes_total
    connection_incoming_packets_total connection_outgoing_bytes_total connection_outgoing_packets_total
    connection_pending_packets connection_process_reductions_total connections_closed_total connections_opened_total
    consumer_prefetch disk_space_available_bytes disk_space_available_limit_bytes erlang_gc_reclaimed_bytes_total
    erlang_gc_runs_total erlang_net_ticktime_seconds erlang_processes_limit erlang_processes_used
    erlang_scheduler_context_switches_total erlang_scheduler_run_queue exchange_bindings io_read_bytes_total
    io_read_ops_total io_reopen_ops_total io_seek_ops_total io_sync_ops_total io_write_bytes_total io_write_ops_total
    msg_store_read_total msg_store_write_total process_max_fds process_max_tcp_sockets process_open_fds
    process_open_tcp_sockets process_resident_memory_bytes queue_consumer_capacity queue_consumer_utilisation
    queue_consumers queue_disk_reads_total queue_disk_writes_total queue_head_message_timestamp
    queue_index_read_ops_total queue_index_write_ops_total queue_messages queue_messages_bytes
    queue_messages_paged_out queue_messages_paged_out_bytes queue_messages_persistent queue_messages_persistent_bytes
    queue_messages_published_total queue_messages_ram queue_messages_ram_bytes queue_messages_ready
    queue_messages_ready_bytes queue_messages_ready_ram queue_messages_unacked queue_messages_unacked_bytes
    queue_messages_unacked_ram queue_process_memory_bytes queue_process_reductions_total queues_created_total
    queues_declared_total queues_deleted_total raft_log_commit_index raft_log_last_applied_index
    raft_log_last_written_index raft_log_snapshot_index raft_term_total resident_memory_limit_bytes
    schema_db_disk_tx_total schema_db_ram_tx_total vhost_status identity_info build_info
""".split()}


# What Grafana puts in a query before Prometheus sees it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$vhost": "order-expiry", "$prefix": "orders"}

PANEL_TYPES = ("timeseries", "stat", "gauge", "bargauge", "table")


def promql_metrics(expr: str) -> list[str]:
    return re.findall(r"\b((?:order_expiry|rabbitmq)_[a-z0-9_]+)\b", expr)


def load_dashboard() -> dict:
    try:
        return json.loads(read_text(GRAFANA_DASHBOARD))
    except json.JSONDecodeError as e:
        raise CheckFailed(f"{rel(GRAFANA_DASHBOARD)} is not JSON: {e}") from e


def check_variables(dashboard: dict) -> None:
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list", [])}
    require((variables.get("datasource") or {}).get("type") == "datasource"
            and variables["datasource"].get("query") == "prometheus", "needs a Prometheus datasource variable")
    for var in ("vhost", "prefix"):
        require(var in variables, f"needs a ${var} variable")
    require(variables["vhost"].get("query") == default_settings()["topology"]["vhost"], "$vhost defaults to topology.vhost")
    require(variables["prefix"].get("query") == topology_prefix(), "$prefix defaults to topology.prefix")


def check_panel(panel: dict, ids: set) -> list[str]:
    """The panel's shape; returns its queries."""
    title = panel.get("title")
    require(title and panel.get("type") in PANEL_TYPES, f"panel {title!r}: needs a title and a known type")
    require(panel.get("id") not in ids, f"panel {title!r}: duplicate id")
    ids.add(panel.get("id"))
    grid = panel.get("gridPos") or {}
    require(all(isinstance(grid.get(k), int) for k in "hwxy"), f"panel {title!r}: gridPos needs h, w, x, y")
    require((panel.get("datasource") or {}).get("uid") == "${datasource}", f"panel {title!r}: use the $datasource")
    targets = panel.get("targets") or []
    require(targets, f"panel {title!r} has no targets")
    exprs = []
    for target in targets:
        expr = target.get("expr", "")
        names = promql_metrics(expr)
        require(names, f"panel {title!r}: {expr!r} names no order_expiry_ or rabbitmq_ metric")
        for name in names:
            if name.startswith("rabbitmq_"):
                require(name in RABBITMQ_PROMETHEUS_METRICS, f"panel {title!r}: {name} is not a rabbitmq_prometheus metric")
        exprs.append(expr)
    return exprs


@check("grafana: deploy/grafana/order-expiry.json is a dashboard of known panels and broker metrics")
def grafana_dashboard():
    dashboard = load_dashboard()
    require(dashboard.get("title") and dashboard.get("uid"), "dashboard needs a title and a uid")
    require(isinstance(dashboard.get("schemaVersion"), int), "dashboard needs a schemaVersion")
    check_variables(dashboard)
    panels = dashboard.get("panels")
    require(isinstance(panels, list) and panels, "dashboard has no panels")
    ids: set = set()
    exprs = [expr for panel in panels for expr in check_panel(panel, ids)]
    joined = "\n".join(exprs)
    for needle, what in (
        ("rate(order_expiry_messages_total", "outcomes per second"),
        ("histogram_quantile(0.99, sum by (le) (rate(order_expiry_lateness_seconds_bucket", "lateness p99"),
        ('rabbitmq_queue_messages_ready{vhost="$vhost", queue="$prefix.due"}', "due-queue depth"),
        ('queue="$prefix.parked"', "parked count"),
    ):
        require(needle in joined, f"dashboard has no panel for {what} ({needle})")
    promtool_parses(exprs)
    return f"{len(panels)} panels, {len(exprs)} queries, promtool parses them"


def promtool_parses(exprs: list[str]) -> None:
    """Each query, Grafana's variables filled in, as a recording rule for `promtool check rules`."""
    for variable, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(variable, value) for e in exprs]
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        f.flush()
        result = subprocess.run([os.environ.get("PROMTOOL", "promtool"), "check", "rules", f.name],
                                capture_output=True, text=True, check=False)
    bad = [exprs[int(i)] for i in re.findall(r"dashboard:query_(\d+)", result.stdout + result.stderr)]
    require(result.returncode == 0, f"promtool: {(result.stdout + result.stderr).strip()}\n     the queries: {bad}")
