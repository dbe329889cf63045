#!/usr/bin/env python3
"""Offline checks of the deployment artifacts (docker-compose.yml, deploy/).

Run it through scripts/check-deploy, which provides the pinned tools
(check-jsonschema, kubernetes-validate, PyYAML) in target/deploy-venv.
Prints one line per check and ends with "N passed, M failed"; exits 1 on any failure.
Nothing here touches the network or Docker.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import traceback
from pathlib import Path
from urllib.parse import unquote, urlsplit

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
RABBITMQ_CONF = DEPLOY / "rabbitmq.conf"
ENABLED_PLUGINS = DEPLOY / "enabled_plugins"
DEFINITIONS = ROOT / "definitions.json"
INIT_SQL = DEPLOY / "postgres" / "init.sql"
DEPLOY_README = DEPLOY / "README.md"
README = ROOT / "README.md"
GRAFANA_DASHBOARD = DEPLOY / "grafana" / "order-expiry.json"
SRC = ROOT / "src"

# The least-privilege users of definitions.json (src/definitions.rs).
PUBLISHER_USER = "order-expiry-publisher"
CONSUMER_USER = "order-expiry-consumer"

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

# Oldest and newest Kubernetes minor versions the manifests must validate against
# (schemas ship inside the pinned kubernetes-validate package).
K8S_VERSIONS = ["1.27.0", "1.37.0"]
CONTAINER_UID = 10001
EXAMPLE_SECRET_FILE = "secret.example.yaml"
DEFINITIONS_CONFIGMAP = "order-expiry-definitions"

# Kinds that are not built into Kubernetes, with the structural check for each.
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("rabbitmq.com/v1beta1", "RabbitmqCluster"),
}


class CheckFailed(Exception):
    """A check found a problem; the message says which."""


def require(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


CHECKS: list[tuple[str, object]] = []


def check(name: str):
    def register(fn):
        CHECKS.append((name, fn))
        return fn

    return register


# ---------------------------------------------------------------------------
# Loading and small parsers
# ---------------------------------------------------------------------------


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def read_text(path: Path) -> str:
    require(path.is_file(), f"{rel(path)} is missing")
    return path.read_text(encoding="utf-8")


def load_yaml_docs(path: Path) -> list:
    try:
        docs = [d for d in yaml.safe_load_all(read_text(path)) if d is not None]
    except yaml.YAMLError as e:
        raise CheckFailed(f"{rel(path)} is not valid YAML: {e}") from e
    require(docs, f"{rel(path)} has no YAML document")
    return docs


@functools.cache
def compose() -> dict:
    docs = load_yaml_docs(COMPOSE_FILE)
    require(len(docs) == 1, "docker-compose.yml must hold exactly one YAML document")
    require(isinstance(docs[0], dict), "docker-compose.yml is not a mapping")
    return docs[0]


def service(name: str) -> dict:
    services = compose().get("services") or {}
    require(name in services, f"docker-compose.yml has no service {name!r}")
    return services[name] or {}


_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str) -> str:
    """Compose ${VAR:-default} interpolation with an empty environment, so the
    checks see the committed defaults whatever the caller's shell exports."""

    def substitute(m: re.Match) -> str:
        if m.group(4):
            return ""
        op, default = m.group(2), m.group(3)
        if op in (":-", "-"):
            return default
        if op in (":?", "?"):
            raise CheckFailed(f"{m.group(0)} has no default in docker-compose.yml")
        return ""

    return _INTERPOLATION.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


def environment(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        out = {}
        for item in env:
            key, _, value = str(item).partition("=")
            out[key] = value
        env = out
    return {k: interpolate(str(v)) for k, v in env.items()}


def duration_seconds(text: str) -> float:
    """Compose durations: 30s, 1m30s, 1h, 500ms, 2.5s."""
    text = str(text).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text)
    require(parts and "".join(n + u for n, u in parts) == text, f"cannot parse duration {text!r}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


def bind_mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(host path, container path, read-only) of every bind mount of a service."""
    mounts = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            if vol.get("type") == "bind":
                mounts.append((interpolate(vol["source"]), vol["target"], bool(vol.get("read_only"))))
            continue
        parts = interpolate(str(vol)).split(":")
        if len(parts) >= 2 and (parts[0].startswith(".") or parts[0].startswith("/") or parts[0].startswith("~")):
            mode = parts[2] if len(parts) > 2 else ""
            mounts.append((parts[0], parts[1], "ro" in mode.split(",")))
    return mounts


@functools.cache
def default_settings() -> dict:
    try:
        return tomllib.loads(read_text(ROOT / "config" / "default.toml"))
    except tomllib.TOMLDecodeError as e:
        raise CheckFailed(f"config/default.toml: {e}") from e


def drain_timeout_s(overrides: dict[str, str] | None = None) -> float:
    key = "ORDER_EXPIRY__CONSUMER__DRAIN_TIMEOUT_MS"
    if overrides and key in overrides:
        return int(overrides[key]) / 1000
    return default_settings()["consumer"]["drain_timeout_ms"] / 1000


def topology_prefix(overrides: dict[str, str] | None = None) -> str:
    key = "ORDER_EXPIRY__TOPOLOGY__PREFIX"
    if overrides and key in overrides:
        return overrides[key]
    return default_settings()["topology"]["prefix"]


def listen_port(listen: str) -> int:
    m = re.fullmatch(r"(?:\[[^\]]*\]|[^:]*):(\d+)", listen)
    require(m, f"cannot read a port from listen address {listen!r}")
    return int(m.group(1))


@functools.cache
def definitions() -> dict:
    try:
        defs = json.loads(read_text(DEFINITIONS))
    except json.JSONDecodeError as e:
        raise CheckFailed(f"definitions.json is not JSON: {e}") from e
    require(isinstance(defs, dict), "definitions.json is not a JSON object")
    return defs


def rabbitmq_conf(text: str) -> dict[str, str]:
    """new-style rabbitmq.conf (sysctl format): key = value, # comments."""
    conf = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        require(sep and key.strip() and value.strip(), f"line {number} is not 'key = value': {line!r}")
        require(" " not in key.strip(), f"line {number}: bad key {key.strip()!r}")
        require(key.strip() not in conf, f"line {number}: {key.strip()} set twice")
        conf[key.strip()] = value.strip()
    return conf


def rabbit_password_matches(user: dict, password: str) -> bool:
    """RabbitMQ's internal hashing: base64(salt[4] + H(salt + password))."""
    if "password" in user:
        return user["password"] == password
    algorithms = {
        "rabbit_password_hashing_sha256": hashlib.sha256,
        "rabbit_password_hashing_sha512": hashlib.sha512,
        "rabbit_password_hashing_md5": hashlib.md5,
    }
    algorithm = algorithms.get(user.get("hashing_algorithm", "rabbit_password_hashing_sha256"))
    require(algorithm, f"unknown hashing_algorithm {user.get('hashing_algorithm')!r}")
    raw = base64.b64decode(user["password_hash"])
    salt, digest = raw[:4], raw[4:]
    return algorithm(salt + password.encode()).digest() == digest


def amqp_credentials(url: str) -> tuple[str, str, str, str]:
    """(user, password, host, vhost) of an amqp:// URL."""
    parts = urlsplit(url)
    require(parts.scheme in ("amqp", "amqps"), f"not an AMQP URL: {parts.scheme}://...")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return unquote(parts.username or ""), unquote(parts.password or ""), parts.hostname or "", vhost


def imported(files: list[tuple[str, dict]]) -> dict:
    """What a broker holds after importing the definitions `files` in this order,
    as RabbitMQ does: importing a user again replaces its password hash and tags
    (an empty hash clears the password), a later permission replaces an earlier
    one for the same user and vhost. Within one file vhosts come before
    permissions, so a permission may use a vhost of its own file or an earlier one."""
    users, vhosts, permissions, topic = {}, set(), {}, {}
    for name, defs in files:
        for u in defs.get("users", []):
            require("tags" in u, f"{name}: user {u.get('name')!r} has no 'tags' (RabbitMQ rejects it)")
            users[u["name"]] = (name, u)
        vhosts |= {v["name"] for v in defs.get("vhosts", [])}
        for p in defs.get("permissions", []) + defs.get("topic_permissions", []):
            require(p["vhost"] in vhosts, f"{name}: permission of {p['user']!r} on vhost {p['vhost']!r}, "
                                          "which neither this file nor an earlier one declares")
        for p in defs.get("permissions", []):
            permissions[(p["user"], p["vhost"])] = p
        for t in defs.get("topic_permissions", []):
            topic[(t["user"], t["vhost"], t["exchange"])] = t
    return {"users": users, "vhosts": vhosts, "permissions": permissions, "topic": topic}


def allows(pattern: str, name: str) -> bool:
    """RabbitMQ's permission test: an unanchored regex search; "" denies."""
    return bool(pattern) and re.search(pattern, name) is not None


def check_login(state: dict, user: str, password: str, vhost: str) -> dict:
    """`user` logs in with `password` after the import and has permissions on
    `vhost`; returns those permissions."""
    require(user in state["users"], f"no imported definitions file creates user {user!r}")
    source, u = state["users"][user]
    require(u.get("password") or u.get("password_hash"),
            f"user {user!r} ends up without a password: {source}, the last file that imports it, sets none "
            "(a users file must sort after definitions.json)")
    require(rabbit_password_matches(u, password), f"{source}: password of user {user!r} does not match the URL's")
    require(vhost in state["vhosts"], f"vhost {vhost!r} of the URL is not declared")
    perms = state["permissions"].get((user, vhost))
    require(perms, f"user {user!r} has no permissions on vhost {vhost!r}")
    return perms


def check_consumer_capabilities(perms: dict, prefix: str, user: str) -> None:
    """What `order-expiry serve` does with the broker (src/consumer.rs)."""
    due, parked = f"{prefix}.due", f"{prefix}.parked"
    for kind, names in (("configure", (due, parked)), ("write", (due, parked)), ("read", (due, parked))):
        for name in names:
            require(allows(perms[kind], name), f"{user!r} needs {kind} on {name} (the consumer re-declares it)")


# ---------------------------------------------------------------------------
# Dockerfile parsing
# ---------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    instructions, buffer = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buffer):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        keyword, _, rest = buffer.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        buffer = ""
    require(not buffer, "Dockerfile ends inside a line continuation")
    return instructions


def instruction_args(rest: str) -> tuple[dict[str, str], list[str]]:
    """Flags (--from=...) and arguments, exec (JSON) form or shell form."""
    flags = {}
    tokens = shlex.split(rest)
    while tokens and tokens[0].startswith("--"):
        key, _, value = tokens.pop(0)[2:].partition("=")
        flags[key] = value
    remainder = " ".join(tokens)
    if remainder.startswith("["):
        try:
            tokens = json.loads(remainder)
        except json.JSONDecodeError as e:
            raise CheckFailed(f"bad JSON form {remainder!r}: {e}") from e
    return flags, tokens


@functools.cache
def dockerfile_stages() -> list[dict]:
    """Stages of deploy/Dockerfile: base image, name and instructions."""
    args: dict[str, str] = {}
    stages: list[dict] = []
    for keyword, rest in dockerfile_instructions(read_text(DOCKERFILE)):
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif keyword == "FROM":
            _, tokens = instruction_args(rest)
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), tokens[0])
            name = tokens[2] if len(tokens) >= 3 and tokens[1].upper() == "AS" else None
            stages.append({"image": image, "name": name, "instructions": []})
        else:
            require(stages, f"{keyword} before the first FROM")
            stages[-1]["instructions"].append((keyword, rest))
    return stages


def dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    patterns = []
    for line in read_text(DOCKERIGNORE).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip().strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        patterns.append((negate, re.compile(regex + r"\Z")))
    return patterns


def dockerignored(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a path is excluded when it
    or one of its parent directories is excluded."""
    parts = path.strip("/").split("/")
    excluded = False
    for negate, regex in dockerignore_patterns():
        for i in range(1, len(parts) + 1):
            if regex.match("/".join(parts[:i])):
                excluded = not negate
                break
    return excluded


# ---------------------------------------------------------------------------
# Kubernetes helpers
# ---------------------------------------------------------------------------


@functools.cache
def k8s_manifests() -> dict[str, list[dict]]:
    require(K8S.is_dir(), "deploy/kubernetes/ is missing")
    manifests = {}
    for path in sorted(K8S.glob("*.y*ml")):
        if path.name == "kustomization.yaml":
            continue
        docs = load_yaml_docs(path)
        for doc in docs:
            require(isinstance(doc, dict) and doc.get("kind") and doc.get("apiVersion"),
                    f"{path.name}: a document has no kind/apiVersion")
        manifests[path.name] = docs
    return manifests


def k8s_find(kind: str, name: str | None = None, include_example: bool = True) -> list[dict]:
    found = []
    for file, docs in k8s_manifests().items():
        if file == EXAMPLE_SECRET_FILE and not include_example:
            continue
        for doc in docs:
            if doc["kind"] == kind and (name is None or doc.get("metadata", {}).get("name") == name):
                found.append(doc)
    return found


def k8s_one(kind: str, name: str | None = None) -> dict:
    found = k8s_find(kind, name)
    require(len(found) == 1, f"expected one {kind}{' ' + name if name else ''} in deploy/kubernetes, found {len(found)}")
    return found[0]


def k8s_validate(doc: dict) -> None:
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path) or "(root)"
            raise CheckFailed(f"{doc['kind']}/{doc.get('metadata', {}).get('name')} at {path}: "
                              f"{e.message} (Kubernetes {version})") from e
        except kubernetes_validate.SchemaNotFoundError as e:
            raise CheckFailed(f"no schema for {doc['apiVersion']} {doc['kind']} in Kubernetes {version}") from e


def secret_keys(name: str) -> dict[str, str]:
    secret = k8s_one("Secret", name)
    data = dict(secret.get("stringData") or {})
    for key, value in (secret.get("data") or {}).items():
        data[key] = base64.b64decode(value).decode()
    return data


def pod_template_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"].get("labels") or {}


def selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def allowed_keys(obj: dict, allowed: set[str], where: str) -> None:
    unknown = set(obj) - allowed
    require(not unknown, f"{where}: unknown field(s) {sorted(unknown)}")


# ---------------------------------------------------------------------------
# Checks: docker-compose.yml
# ---------------------------------------------------------------------------


@check("compose: docker-compose.yml valid against the compose-spec JSON schema")
def compose_schema():
    exe = Path(sys.executable).with_name("check-jsonschema")
    require(exe.exists(), f"{exe} not found")
    result = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True, text=True, check=False,
    )
    require(result.returncode == 0, (result.stdout + result.stderr).strip())
    compose()  # also parses with PyYAML (anchors, single document)
    return "check-jsonschema vendor.compose-spec"


@check("compose: every mounted host path, build context and Dockerfile exists")
def compose_paths():
    count = 0
    for name, svc in (compose().get("services") or {}).items():
        for host, _container, read_only in bind_mounts(svc):
            require((ROOT / host).exists(), f"service {name}: mounted path {host} does not exist")
            require(read_only, f"service {name}: {host} should be mounted read-only (:ro)")
            count += 1
        build = svc.get("build")
        if build is not None:
            if isinstance(build, str):
                build = {"context": build}
            context = ROOT / build.get("context", ".")
            require(context.is_dir(), f"service {name}: build context {build.get('context')} is missing")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            require(dockerfile.resolve() == DOCKERFILE.resolve(),
                    f"service {name}: builds {rel(dockerfile)}, expected deploy/Dockerfile")
            count += 1
    initdb = [h for h, c, _ in bind_mounts(service("postgres")) if c.startswith("/docker-entrypoint-initdb.d/")]
    require(initdb and (ROOT / initdb[0]).resolve() == INIT_SQL.resolve(),
            "postgres must mount deploy/postgres/init.sql into /docker-entrypoint-initdb.d/")
    return f"{count} paths"


@check("compose: consumer and demo wait for healthy rabbitmq and postgres")
def compose_depends_on():
    for name in ("consumer", "demo"):
        deps = service(name).get("depends_on")
        require(isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions")
        for dep in ("rabbitmq", "postgres"):
            require(dep in deps, f"{name}: does not depend on {dep}")
            require((deps[dep] or {}).get("condition") == "service_healthy",
                    f"{name}: depends_on {dep} needs condition: service_healthy")
    for dep in ("rabbitmq", "postgres"):
        health = service(dep).get("healthcheck") or {}
        require(health.get("test") and not health.get("disable"), f"{dep} has no healthcheck for service_healthy")
    require("check_running" in str(service("rabbitmq")["healthcheck"]["test"]),
            "rabbitmq healthcheck should run rabbitmq-diagnostics check_running")
    require("pg_isready" in str(service("postgres")["healthcheck"]["test"]), "postgres healthcheck should use pg_isready")


@check("compose: consumer stop_grace_period exceeds the drain timeout")
def compose_grace():
    consumer = service("consumer")
    grace = duration_seconds(consumer.get("stop_grace_period", "10s"))
    drain = drain_timeout_s(environment(consumer))
    require(grace > drain, f"stop_grace_period {grace:g}s must exceed drain timeout {drain:g}s")
    require(consumer.get("stop_signal", "SIGTERM") == "SIGTERM", "consumer stop_signal must be SIGTERM")
    return f"{grace:g}s > {drain:g}s"


@check("compose: consumer and demo commands, settings and ports")
def compose_consumer_settings():
    consumer, demo = service("consumer"), service("demo")
    require(consumer.get("command") in (["serve"], "serve"), "consumer must run `serve`")
    require(demo.get("command") in (["demo"], "demo"), "demo must run `demo`")
    require("demo" in (demo.get("profiles") or []), "demo service must be under profiles: [demo]")
    require(not consumer.get("profiles"), "consumer must start with a plain `docker compose up`")
    require(consumer.get("restart") == "unless-stopped", "consumer restart policy must be unless-stopped")
    for name, svc in (("consumer", consumer), ("demo", demo)):
        env = environment(svc)
        for key in ("ORDER_EXPIRY__AMQP__URL", "ORDER_EXPIRY__DATABASE__URL",
                    "ORDER_EXPIRY__HTTP__LISTEN", "ORDER_EXPIRY__LOG__FORMAT"):
            require(env.get(key), f"{name}: {key} is not set")
        _, _, host, _ = amqp_credentials(env["ORDER_EXPIRY__AMQP__URL"])
        require(host == "rabbitmq", f"{name}: AMQP URL must point at the rabbitmq service, not {host!r}")
        db = urlsplit(env["ORDER_EXPIRY__DATABASE__URL"])
        require(db.scheme in ("postgres", "postgresql") and db.hostname == "postgres",
                f"{name}: database URL must point at the postgres service")
        pg_password = environment(service("postgres")).get("POSTGRES_PASSWORD")
        require(unquote(db.password or "") == pg_password,
                f"{name}: database URL password differs from postgres' POSTGRES_PASSWORD default")
        require(env["ORDER_EXPIRY__LOG__FORMAT"] in ("json", "text"), f"{name}: log format must be json or text")
    port = listen_port(environment(consumer)["ORDER_EXPIRY__HTTP__LISTEN"])
    published = [str(p) for p in consumer.get("ports") or []]
    require(any(interpolate(p).split(":")[-1].split("/")[0] == str(port) for p in published),
            f"consumer must publish its HTTP port {port}")
    return f"http port {port}"


@check("compose: rabbitmq mounts rabbitmq.conf, enabled_plugins and the definitions")
def compose_rabbitmq_mounts():
    mounts = {container: host for host, container, _ in bind_mounts(service("rabbitmq"))}
    require(mounts.get("/etc/rabbitmq/rabbitmq.conf") == "./deploy/rabbitmq.conf",
            "deploy/rabbitmq.conf must be mounted at /etc/rabbitmq/rabbitmq.conf")
    require(mounts.get("/etc/rabbitmq/enabled_plugins") == "./deploy/enabled_plugins",
            "deploy/enabled_plugins must be mounted at /etc/rabbitmq/enabled_plugins")
    load = rabbitmq_conf(read_text(RABBITMQ_CONF)).get("load_definitions")
    require(load, "deploy/rabbitmq.conf has no load_definitions")
    in_dir = {c: h for c, h in mounts.items() if c.startswith(load.rstrip("/") + "/")}
    if not in_dir:
        require(mounts.get(load) == "./definitions.json", f"definitions.json must be mounted at {load}")
        return f"{load} <- definitions.json"
    require("./definitions.json" in in_dir.values(), f"./definitions.json is not mounted into {load}/")
    require(all(c.endswith(".json") for c in in_dir), f"only .json files may be mounted into {load}/")
    require("management" in str(service("rabbitmq").get("image", "")), "rabbitmq should use a -management image")
    return f"{load}/ <- {', '.join(sorted(Path(c).name for c in in_dir))}"


@check("compose: the AMQP users of the consumer, the demo and the host-side publisher log in after the boot import")
def compose_broker_user():
    """A blank node that imports definitions at boot creates no default user, so
    every user in a URL must come from the definitions files the broker imports,
    in the order it imports them (file name order), with a matching password."""
    load = rabbitmq_conf(read_text(RABBITMQ_CONF)).get("load_definitions")
    require(load, "deploy/rabbitmq.conf has no load_definitions")
    load = load.rstrip("/")
    files = []
    for host, container, _ in bind_mounts(service("rabbitmq")):
        if container == load or container.startswith(load + "/"):
            files.append((container, host, json.loads(read_text(ROOT / host))))
    files.sort(key=lambda f: f[0])
    state = imported([(host, defs) for _, host, defs in files])
    consumer_env = environment(service("consumer"))
    user, password, _, vhost = amqp_credentials(consumer_env["ORDER_EXPIRY__AMQP__URL"])
    require(user == CONSUMER_USER, f"the consumer must connect as {CONSUMER_USER}, not {user!r}")
    check_consumer_capabilities(check_login(state, user, password, vhost), topology_prefix(consumer_env), user)
    checked = [f"{user} on {vhost!r}"]
    demo_user, demo_password, _, demo_vhost = amqp_credentials(environment(service("demo"))["ORDER_EXPIRY__AMQP__URL"])
    check_login(state, demo_user, demo_password, demo_vhost)
    checked.append(f"demo {demo_user}")
    # The publisher URL documented for the order service on the host.
    documented = re.findall(r"amqps?://[^\s`'\"]+", read_text(DEPLOY_README))
    publisher_urls = [u for u in documented if amqp_credentials(u)[0] == PUBLISHER_USER]
    require(publisher_urls, f"deploy/README.md documents no {PUBLISHER_USER} URL for the compose broker")
    for url in publisher_urls:
        user, password, _, vhost = amqp_credentials(url)
        check_login(state, user, password, vhost)
    checked.append(f"{PUBLISHER_USER} as documented")
    if "guest" in (user, demo_user):
        require(rabbitmq_conf(read_text(RABBITMQ_CONF)).get("loopback_users.guest") == "false",
                "guest connects from another container: set loopback_users.guest = false")
    return f"{', '.join(checked)}; import order {' then '.join(Path(c).name for c, _, _ in files)}"


# ---------------------------------------------------------------------------
# Checks: RabbitMQ and PostgreSQL files
# ---------------------------------------------------------------------------


@check("rabbitmq: deploy/rabbitmq.conf parses and sets load_definitions")
def rabbitmq_conf_check():
    conf = rabbitmq_conf(read_text(RABBITMQ_CONF))
    load = conf.get("load_definitions")
    require(load and load.startswith("/etc/rabbitmq/"), "load_definitions must point under /etc/rabbitmq/")
    for key in conf:
        require(re.fullmatch(r"[a-z0-9_]+(\.[A-Za-z0-9_$-]+)*", key), f"suspicious key {key!r}")
    return f"{len(conf)} settings, load_definitions = {load}"


@check("rabbitmq: deploy/enabled_plugins enables management and prometheus")
def enabled_plugins():
    text = read_text(ENABLED_PLUGINS).strip()
    m = re.fullmatch(r"\[\s*([a-z0-9_]+(?:\s*,\s*[a-z0-9_]+)*)?\s*\]\s*\.", text)
    require(m, "not an Erlang list term like [rabbitmq_management,rabbitmq_prometheus].")
    plugins = [p.strip() for p in (m.group(1) or "").split(",") if p.strip()]
    for plugin in ("rabbitmq_management", "rabbitmq_prometheus"):
        require(plugin in plugins, f"{plugin} is not enabled")
    return ", ".join(plugins)


@check("rabbitmq: definitions.json has consistent exchanges, queues and bindings")
def definitions_check():
    defs = definitions()
    for key in ("exchanges", "queues", "bindings", "vhosts"):
        require(isinstance(defs.get(key), list) and defs[key], f"definitions.json has no {key}")
    exchanges = {(x["vhost"], x["name"]) for x in defs["exchanges"]}
    queues = {(q["vhost"], q["name"]) for q in defs["queues"]}
    vhosts = {v["name"] for v in defs["vhosts"]}
    for obj in defs["exchanges"] + defs["queues"]:
        require(obj["vhost"] in vhosts, f"{obj['name']}: vhost {obj['vhost']!r} is not declared")
    for b in defs["bindings"]:
        require((b["vhost"], b["source"]) in exchanges, f"binding from unknown exchange {b['source']!r}")
        target = queues if b["destination_type"] == "queue" else exchanges
        require((b["vhost"], b["destination"]) in target,
                f"binding to unknown {b['destination_type']} {b['destination']!r}")
    for q in defs["queues"]:
        dlx = (q.get("arguments") or {}).get("x-dead-letter-exchange")
        require(dlx is None or (q["vhost"], dlx) in exchanges, f"{q['name']}: unknown dead-letter exchange {dlx!r}")
    prefix = topology_prefix()
    names = {q["name"] for q in defs["queues"]}
    for suffix in ("due", "parked"):
        require(f"{prefix}.{suffix}" in names, f"queue {prefix}.{suffix} is missing")
    return f"{len(defs['exchanges'])} exchanges, {len(defs['queues'])} queues, {len(defs['bindings'])} bindings"


@check("rabbitmq: definitions.json has its own vhost and least-privilege users without passwords")
def definitions_access():
    defs = definitions()
    vhost = default_settings()["topology"]["vhost"]
    require(vhost != "/", "the definitions need a vhost of their own, not /")
    require([v["name"] for v in defs["vhosts"]] == [vhost], f"definitions.json must declare exactly vhost {vhost!r}")
    users = {u["name"]: u for u in defs.get("users", [])}
    require(set(users) == {PUBLISHER_USER, CONSUMER_USER}, f"users must be {PUBLISHER_USER} and {CONSUMER_USER}, not {sorted(users)}")
    for name, u in users.items():
        require("password" not in u and u.get("password_hash") == "",
                f"{name}: definitions.json must carry no password (empty password_hash, set at deploy time)")
        require(not u.get("tags"), f"{name}: no tags (no management or administrator rights)")
    perms = {p["user"]: p for p in defs.get("permissions", [])}
    require(set(perms) == set(users) and all(p["vhost"] == vhost for p in perms.values()),
            f"one permission per user, on vhost {vhost!r}")
    prefix = topology_prefix()
    exchanges = {x["name"] for x in defs["exchanges"]}
    queues = {q["name"] for q in defs["queues"]}
    entries = {x for x in exchanges if x.startswith(f"{prefix}.ladder.")} | {f"{prefix}.due"}
    publisher = perms[PUBLISHER_USER]
    require(publisher["configure"] == "" and publisher["read"] == "", "the publisher may not configure or read anything")
    for name in sorted(exchanges | queues):
        require(allows(publisher["write"], name) == (name in entries),
                f"publisher write {'must' if name in entries else 'must not'} match {name}")
    consumer = perms[CONSUMER_USER]
    own = {f"{prefix}.due", f"{prefix}.parked"}
    for kind in ("configure", "write", "read"):
        for name in sorted(exchanges | queues):
            require(allows(consumer[kind], name) == (name in own),
                    f"consumer {kind} {'must' if name in own else 'must not'} match {name}")
    topic = {(t["user"], t["exchange"]): t for t in defs.get("topic_permissions", [])}
    due = topic.get((CONSUMER_USER, f"{prefix}.due"))
    require(due and due["vhost"] == vhost, f"the consumer needs a topic permission on exchange {prefix}.due")
    for key in ("", "#", "0.1", "0." * 21 + "1"):
        require(not re.search(due["write"], key), f"the consumer may not publish to {prefix}.due (key {key!r})")
    require(re.search(due["read"], "#"), f"the consumer must be able to bind {prefix}.due with '#'")
    return f"vhost {vhost}; {PUBLISHER_USER}: write {len(entries)} entry exchanges; {CONSUMER_USER}: {', '.join(sorted(own))}"


def normalize_sql(sql: str) -> str:
    sql = re.sub(r"--[^\n]*", "", sql)
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


@check("postgres: deploy/postgres/init.sql is the orders table of `order-expiry migrate`")
def init_sql():
    source = read_text(ROOT / "src" / "orders.rs")
    m = re.search(r'SCHEMA_SQL: &str = "(.*?)";', source, re.S)
    require(m, "cannot find SCHEMA_SQL in src/orders.rs")
    expected = normalize_sql(m.group(1))
    actual = normalize_sql(read_text(INIT_SQL))
    require(actual == expected, f"init.sql differs from src/orders.rs SCHEMA_SQL:\n  {actual}\n  {expected}")
    return "same as src/orders.rs SCHEMA_SQL"


# ---------------------------------------------------------------------------
# Checks: Dockerfile and .dockerignore
# ---------------------------------------------------------------------------


@check("dockerfile: multi-stage build of `order-expiry` with cargo --release --locked")
def dockerfile_stages_check():
    stages = dockerfile_stages()
    require(len(stages) >= 2, f"{len(stages)} FROM: a multi-stage build needs at least two")
    builder, runtime = stages[0], stages[-1]
    require(re.fullmatch(r"rust:[\w.-]*bookworm[\w.-]*", builder["image"]), f"builder image {builder['image']} is not rust:*-bookworm")
    require(runtime["image"].startswith("debian:bookworm-slim"), f"runtime image {runtime['image']} is not debian:bookworm-slim")
    runs = " ".join(rest for k, rest in builder["instructions"] if k == "RUN")
    require(re.search(r"cargo build (?=.*--release)(?=.*--locked)", runs), "builder must run cargo build --release --locked")
    cargo = tomllib.loads(read_text(ROOT / "Cargo.toml"))
    bins = [b["name"] for b in cargo.get("bin", [])] or [cargo["package"]["name"]]
    require("order-expiry" in bins, "Cargo.toml builds no binary order-expiry")
    require("target/release/order-expiry" in runs, "builder does not take target/release/order-expiry")
    return f"{builder['image']} -> {runtime['image']}"


@check("dockerfile: runtime runs as uid 10001, STOPSIGNAL SIGTERM, HEALTHCHECK /healthz")
def dockerfile_runtime():
    runtime = dockerfile_stages()[-1]
    by_keyword: dict[str, list[str]] = {}
    for keyword, rest in runtime["instructions"]:
        by_keyword.setdefault(keyword, []).append(rest)
    users = by_keyword.get("USER", [])
    require(users, "no USER in the runtime stage: it would run as root")
    user = users[-1].split(":")[0]
    require(user not in ("root", "0"), f"USER {users[-1]} is root")
    require(user == str(CONTAINER_UID), f"USER must be the numeric uid {CONTAINER_UID} (runAsNonRoot needs a number)")
    require(by_keyword.get("STOPSIGNAL") == ["SIGTERM"], "STOPSIGNAL SIGTERM is missing")
    health = by_keyword.get("HEALTHCHECK", [])
    require(health and "http://127.0.0.1:8080/healthz" in health[-1], "HEALTHCHECK must hit http://127.0.0.1:8080/healthz")
    require("curl" in health[-1] and any("curl" in r for r in by_keyword.get("RUN", [])),
            "HEALTHCHECK uses curl, which the runtime stage must install")
    require(any("ca-certificates" in r for r in by_keyword.get("RUN", [])), "ca-certificates is not installed")
    require(any("8080" in e for e in by_keyword.get("EXPOSE", [])), "EXPOSE 8080 is missing")
    env = " ".join(by_keyword.get("ENV", []))
    require(re.search(r"ORDER_EXPIRY__HTTP__LISTEN[= ]0\.0\.0\.0:8080", env), "ENV ORDER_EXPIRY__HTTP__LISTEN=0.0.0.0:8080 is missing")
    require(by_keyword.get("ENTRYPOINT") == ['["order-expiry"]'], 'ENTRYPOINT ["order-expiry"] is missing')
    require(by_keyword.get("CMD") == ['["serve"]'], 'CMD ["serve"] is missing')
    return f"USER {users[-1]}"


@check("dockerfile: every COPY source exists and is not excluded by .dockerignore")
def dockerfile_copies():
    stages = dockerfile_stages()
    names = [s["name"] for s in stages]
    sources = []
    for index, stage in enumerate(stages):
        for keyword, rest in stage["instructions"]:
            require(keyword != "ADD", "use COPY, not ADD")
            if keyword != "COPY":
                continue
            flags, tokens = instruction_args(rest)
            require(len(tokens) >= 2, f"COPY {rest}: needs a source and a destination")
            if "from" in flags:
                require(flags["from"] in names[:index], f"COPY --from={flags['from']}: no earlier stage of that name")
                continue
            for src in tokens[:-1]:
                matches = list(ROOT.glob(src)) if any(c in src for c in "*?[") else [ROOT / src]
                require(matches and all(m.exists() for m in matches), f"COPY source {src} does not exist")
                require(not dockerignored(src), f"COPY source {src} is excluded by .dockerignore")
                for m in matches:
                    for f in ([m] if m.is_file() else m.rglob("*")):
                        r = rel(f)
                        if f.suffix in (".rs", ".toml") and dockerignored(r):
                            raise CheckFailed(f"{r} (under COPY {src}) is excluded by .dockerignore")
                sources.append(src)
    for heavy in ("target", ".git"):
        require(dockerignored(heavy), f".dockerignore must exclude {heavy}/")
    return ", ".join(sources)


@check("dockerfile: every target path Cargo.toml names is copied into the builder")
def dockerfile_cargo_targets():
    cargo = tomllib.loads(read_text(ROOT / "Cargo.toml"))
    builder = dockerfile_stages()[0]
    copied = []
    for keyword, rest in builder["instructions"]:
        if keyword == "COPY":
            flags, tokens = instruction_args(rest)
            if "from" not in flags:
                copied += [t.rstrip("/") for t in tokens[:-1]]
    paths = []
    if isinstance(cargo.get("package", {}).get("build"), str):
        paths.append(cargo["package"]["build"])
    if "path" in cargo.get("lib", {}):
        paths.append(cargo["lib"]["path"])
    for section in ("bin", "test", "bench", "example"):
        paths += [t["path"] for t in cargo.get(section, []) if "path" in t]
    require(not cargo.get("workspace"), "Cargo.toml became a workspace: copy its members in deploy/Dockerfile")
    for path in paths:
        require(any(path == c or path.startswith(c + "/") for c in copied),
                f"Cargo.toml names {path}, which deploy/Dockerfile does not copy into the builder")
    return f"{len(paths)} target paths under {', '.join(copied)}"


# ---------------------------------------------------------------------------
# Checks: Kubernetes
# ---------------------------------------------------------------------------


def structural_scaledobject(doc: dict) -> None:
    spec = doc.get("spec") or {}
    allowed_keys(spec, {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "idleReplicaCount", "initialCooldownPeriod",
                        "minReplicaCount", "maxReplicaCount", "advanced", "triggers", "fallback"}, "ScaledObject.spec")
    target = spec.get("scaleTargetRef") or {}
    require(target.get("name"), "ScaledObject.spec.scaleTargetRef.name is required")
    for key in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        require(isinstance(spec.get(key, 0), int) and spec.get(key, 0) >= 0, f"ScaledObject.spec.{key} must be a non-negative integer")
    require(spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100), "minReplicaCount > maxReplicaCount")
    triggers = spec.get("triggers")
    require(isinstance(triggers, list) and triggers, "ScaledObject.spec.triggers is required")
    for trigger in triggers:
        allowed_keys(trigger, {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}, "trigger")
        require(trigger.get("type") and isinstance(trigger.get("metadata"), dict), "trigger needs type and metadata")
        require(all(isinstance(v, str) for v in trigger["metadata"].values()), "trigger metadata values must be strings")
    behavior = ((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior")
    if behavior:
        # KEDA passes this through to the HPA it creates: validate it as one.
        k8s_validate({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                      "metadata": {"name": "keda-hpa"},
                      "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target["name"]},
                               "maxReplicas": spec.get("maxReplicaCount", 100), "behavior": behavior}})


def structural_triggerauthentication(doc: dict) -> None:
    spec = doc.get("spec") or {}
    allowed_keys(spec, {"secretTargetRef", "env", "configMapTargetRef", "podIdentity", "hashiCorpVault",
                        "azureKeyVault", "awsSecretManager", "gcpSecretManager", "boundServiceAccountToken"},
                 "TriggerAuthentication.spec")
    refs = spec.get("secretTargetRef")
    require(isinstance(refs, list) and refs, "TriggerAuthentication.spec.secretTargetRef is required here")
    for ref in refs:
        allowed_keys(ref, {"parameter", "name", "key"}, "secretTargetRef entry")
        require(all(ref.get(k) for k in ("parameter", "name", "key")), "secretTargetRef needs parameter, name and key")


def structural_rabbitmqcluster(doc: dict) -> None:
    spec = doc.get("spec") or {}
    allowed_keys(spec, {"replicas", "image", "imagePullSecrets", "service", "persistence", "resources", "affinity",
                        "tolerations", "rabbitmq", "tls", "override", "skipPostDeploySteps",
                        "terminationGracePeriodSeconds", "delayStartSeconds", "secretBackend",
                        "autoEnableAllFeatureFlags"}, "RabbitmqCluster.spec")
    require(isinstance(spec.get("replicas"), int) and spec["replicas"] >= 0, "RabbitmqCluster.spec.replicas must be an integer")
    rabbitmq = spec.get("rabbitmq") or {}
    allowed_keys(rabbitmq, {"additionalPlugins", "additionalConfig", "advancedConfig", "envConfig", "erlangInetConfig"},
                 "RabbitmqCluster.spec.rabbitmq")
    require(len(rabbitmq.get("additionalConfig", "")) <= 2000, "additionalConfig is limited to 2000 characters")
    for plugin in rabbitmq.get("additionalPlugins", []):
        require(re.fullmatch(r"\w+", plugin), f"bad plugin name {plugin!r}")
    if "service" in spec:
        require(spec["service"].get("type", "ClusterIP") in ("ClusterIP", "LoadBalancer", "NodePort"), "bad service.type")
    override = spec.get("override") or {}
    allowed_keys(override, {"statefulSet", "service", "clientService"}, "RabbitmqCluster.spec.override")
    sts = (override.get("statefulSet") or {}).get("spec") or {}
    pod_spec = ((sts.get("template") or {}).get("spec"))
    if pod_spec:
        # The override is merged into the operator's StatefulSet: validate it as a PodSpec.
        k8s_validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "override"}, "spec": pod_spec})


STRUCTURAL = {
    "ScaledObject": structural_scaledobject,
    "TriggerAuthentication": structural_triggerauthentication,
    "RabbitmqCluster": structural_rabbitmqcluster,
}


def k8s_file_check(file: str):
    def run():
        kinds = []
        for doc in k8s_manifests()[file]:
            require(doc.get("metadata", {}).get("name"), f"{doc['kind']} has no metadata.name")
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                STRUCTURAL[doc["kind"]](doc)
                kinds.append(f"{doc['kind']} (CRD, structural)")
            else:
                k8s_validate(doc)
                kinds.append(doc["kind"])
        return ", ".join(kinds)

    return run


def register_k8s_file_checks() -> None:
    files = sorted(p.name for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml") if K8S.is_dir() else []
    if not files:
        CHECKS.append(("kubernetes: manifests exist", lambda: require(False, "deploy/kubernetes/ has no manifests")))
    for file in files:
        CHECKS.append((f"kubernetes: {file} valid (Kubernetes {', '.join(v.rsplit('.', 1)[0] for v in K8S_VERSIONS)}, strict)",
                       k8s_file_check(file)))


@check("kubernetes: kustomization.yaml lists every manifest but the example secret")
def kustomization():
    docs = load_yaml_docs(K8S / "kustomization.yaml")
    resources = docs[0].get("resources") or []
    for r in resources:
        require("/" not in r and (K8S / r).is_file(), f"resource {r} is not a file in deploy/kubernetes/")
    expected = set(k8s_manifests()) - {EXAMPLE_SECRET_FILE}
    require(set(resources) == expected, f"resources {sorted(resources)} != manifests {sorted(expected)}")
    require(EXAMPLE_SECRET_FILE not in resources, f"{EXAMPLE_SECRET_FILE} holds placeholders and must not be applied")
    require(not docs[0].get("configMapGenerator"), "no configMapGenerator: kustomize refuses ../../definitions.json")
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return f"{len(resources)} resources (kubectl not installed: render skipped)"
    result = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=False, timeout=60)
    require(result.returncode == 0, f"kubectl kustomize failed: {result.stderr.strip()}")
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    require(len(rendered) == sum(len(k8s_manifests()[r]) for r in resources), "kubectl kustomize rendered a different set")
    return f"{len(resources)} resources, kubectl kustomize renders {len(rendered)} objects"


@check("kubernetes: deployment probes, security context, resources and grace period")
def k8s_deployment():
    deployment = k8s_one("Deployment", "order-expiry")
    pod = deployment["spec"]["template"]["spec"]
    containers = pod["containers"]
    require(len(containers) == 1, "expected one container")
    c = containers[0]
    config = k8s_one("ConfigMap", "order-expiry-config")["data"]
    port = listen_port(config.get("ORDER_EXPIRY__HTTP__LISTEN", ""))
    require(config["ORDER_EXPIRY__HTTP__LISTEN"].startswith("0.0.0.0:"), "the kubelet probes the pod IP: listen on 0.0.0.0")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    require(ports.get("http") == port, f"containerPort 'http' must be the listen port {port}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        require(get.get("path") == path, f"{probe} must GET {path}")
        require(get.get("port") in ("http", port), f"{probe} must use port http")
    require(c.get("args") in (["serve"], None), "container must run `serve`")
    pod_sc, c_sc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    require(pod_sc.get("runAsNonRoot") or c_sc.get("runAsNonRoot"), "runAsNonRoot is not set")
    require(c_sc.get("readOnlyRootFilesystem"), "readOnlyRootFilesystem is not set")
    require(c_sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    require(pod_sc.get("runAsUser", c_sc.get("runAsUser")) == CONTAINER_UID, f"runAsUser must be {CONTAINER_UID} (the image's USER)")
    resources = c.get("resources") or {}
    for kind in ("requests", "limits"):
        require((resources.get(kind) or {}).get("memory"), f"resources.{kind}.memory is not set")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    drain = drain_timeout_s(config)
    require(grace > drain, f"terminationGracePeriodSeconds {grace} must exceed the drain timeout {drain:g}s")
    env = {e["name"]: e for e in c.get("env", [])}
    for var in ("ORDER_EXPIRY__AMQP__URL", "ORDER_EXPIRY__DATABASE__URL"):
        ref = ((env.get(var) or {}).get("valueFrom") or {}).get("secretKeyRef")
        require(ref, f"{var} must come from a secretKeyRef")
        require(ref["key"] in secret_keys(ref["name"]), f"{var}: secret {ref['name']} has no key {ref['key']}")
    refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
    require("order-expiry-config" in refs, "envFrom must include configMapRef order-expiry-config")
    require(not set(config) & set(env), f"settings both in the ConfigMap and env: {set(config) & set(env)}")
    return f"grace {grace}s > drain {drain:g}s, memory {resources['requests']['memory']}/{resources['limits']['memory']}"


@check("kubernetes: service and PDB select the deployment's pods")
def k8s_selectors():
    deployment = k8s_one("Deployment", "order-expiry")
    labels = pod_template_labels(deployment)
    require(selects(deployment["spec"]["selector"], labels), "deployment selector does not match its pod labels")
    svc = k8s_one("Service", "order-expiry")
    require(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "service selector does not match the pods")
    container_ports = {p.get("name"): p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for p in svc["spec"]["ports"]:
        target = p.get("targetPort", p["port"])
        require(target in container_ports or target in container_ports.values(), f"service targetPort {target} is not a container port")
    pdb = k8s_one("PodDisruptionBudget")
    require(selects(pdb["spec"]["selector"], labels), "PDB selector does not match the pods")
    require("maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"], "PDB sets neither maxUnavailable nor minAvailable")
    return f"metrics port {svc['spec']['ports'][0]['port']}"


@check("kubernetes: KEDA scales the deployment on the due queue with the broker secret")
def k8s_keda():
    so = k8s_one("ScaledObject")
    spec = so["spec"]
    deployment = k8s_one("Deployment", spec["scaleTargetRef"]["name"])
    require(spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment", "scaleTargetRef must be the Deployment")
    require("replicas" not in deployment["spec"], "KEDA owns the replica count: drop spec.replicas from the Deployment")
    require(spec.get("minReplicaCount", 0) >= 1, "minReplicaCount must be >= 1: due messages need a running consumer")
    config = k8s_one("ConfigMap", "order-expiry-config")["data"]
    due = f"{topology_prefix(config)}.due"
    rabbit = [t for t in spec["triggers"] if t["type"] == "rabbitmq"]
    require(rabbit, "no rabbitmq trigger")
    queue_names = {q["name"] for q in definitions()["queues"]}
    for t in rabbit:
        md = t["metadata"]
        require(md.get("queueName") == due, f"trigger queueName must be {due}")
        require(due in queue_names, f"{due} is not in definitions.json")
        require(md.get("mode") in ("QueueLength", "MessageRate"), "mode must be QueueLength or MessageRate")
        require(re.fullmatch(r"\d+(\.\d+)?", md.get("value", "")), "value must be a number in a string")
        require(md.get("protocol", "auto") in ("auto", "amqp", "http"), "protocol must be auto, amqp or http")
        require(md["mode"] != "MessageRate" or md.get("protocol") == "http", "MessageRate needs protocol http")
        auth = (t.get("authenticationRef") or {}).get("name")
        require(auth or md.get("host") or md.get("hostFromEnv"), "the trigger has no host and no authenticationRef")
        if auth:
            ta = k8s_one("TriggerAuthentication", auth)
            params = {r["parameter"] for r in ta["spec"]["secretTargetRef"]}
            require(params <= {"host", "username", "password", "vhostName", "tls", "ca", "cert", "key", "keyPassword",
                               "workloadIdentityResource"}, f"unknown rabbitmq auth parameters {params}")
            require("host" in params or md.get("host"), "no host from TriggerAuthentication or metadata")
            for r in ta["spec"]["secretTargetRef"]:
                require(r["key"] in secret_keys(r["name"]), f"secret {r['name']} has no key {r['key']}")
                if r["parameter"] == "host":
                    value = secret_keys(r["name"])[r["key"]]
                    require(urlsplit(value).scheme in ("amqp", "amqps", "http", "https"), "host must be an amqp:// or http:// URL")
                    require(md.get("protocol", "auto") != "amqp" or value.startswith("amqp"), "protocol amqp needs an amqp:// host")
    return f"{due}, {spec.get('minReplicaCount')}..{spec.get('maxReplicaCount')} replicas"


@check("kubernetes: RabbitmqCluster imports users and the topology from a definitions directory")
def k8s_rabbitmq_cluster():
    cluster = k8s_one("RabbitmqCluster")
    spec = cluster["spec"]
    require(spec.get("replicas") == 3, "RabbitmqCluster must have 3 replicas")
    conf = rabbitmq_conf(spec["rabbitmq"].get("additionalConfig", ""))
    load = conf.get("load_definitions")
    require(load, "additionalConfig has no load_definitions")
    pod = spec["override"]["statefulSet"]["spec"]["template"]["spec"]
    containers = [c for c in pod["containers"] if c["name"] == "rabbitmq"]
    require(containers, "override must patch the container named 'rabbitmq'")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounted = {}
    for m in containers[0].get("volumeMounts", []):
        require(m.get("name") in volumes and m.get("mountPath"), f"volumeMount {m} needs a known volume and a mountPath")
        mounted[m["mountPath"]] = (volumes[m["name"]], m.get("subPath"))
    in_dir = {p: v for p, v in mounted.items() if p.startswith(load.rstrip("/") + "/")} or (
        {load: mounted[load]} if load in mounted else {})
    require(in_dir, f"nothing is mounted at {load}")
    require(all(p.endswith(".json") for p in in_dir), f"only .json files may be mounted into {load}")
    sources = {}
    for path, (volume, sub_path) in in_dir.items():
        require(sub_path, f"{path}: mount one key with subPath, a whole volume adds ..data entries")
        if "configMap" in volume:
            sources[path] = ("configMap", volume["configMap"]["name"], sub_path)
        elif "secret" in volume:
            sources[path] = ("secret", volume["secret"]["secretName"], sub_path)
        else:
            raise CheckFailed(f"{path}: volume must be a ConfigMap or a Secret")
    require(("configMap", DEFINITIONS_CONFIGMAP, "definitions.json") in sources.values(),
            f"ConfigMap {DEFINITIONS_CONFIGMAP} (key definitions.json) must be mounted into {load}")
    readme = read_text(DEPLOY_README)
    require(f"kubectl create configmap {DEFINITIONS_CONFIGMAP} --from-file=definitions.json" in readme,
            f"deploy/README.md must document `kubectl create configmap {DEFINITIONS_CONFIGMAP} --from-file=definitions.json`")
    # Import in mount-path order: definitions.json (ConfigMap) and the example
    # Secret's users.json; the consumer's and the publisher's URLs must log in.
    files = []
    for path in sorted(sources):
        kind, name, key = sources[path]
        if kind == "configMap":
            require(name == DEFINITIONS_CONFIGMAP, f"unexpected ConfigMap {name} in {load}")
            files.append((f"{Path(path).name} (definitions.json)", definitions()))
        else:
            files.append((f"{Path(path).name} (secret {name})", json.loads(secret_keys(name)[key])))
    require(any(k == "secret" for k, _, _ in sources.values()),
            "no users file is mounted: a blank node importing definitions creates no user")
    state = imported(files)
    secrets = secret_keys("order-expiry-secrets")
    config = k8s_one("ConfigMap", "order-expiry-config")["data"]
    for key, expected in (("amqp-url", CONSUMER_USER), ("publisher-amqp-url", PUBLISHER_USER)):
        require(key in secrets, f"secret order-expiry-secrets has no {key}")
        user, password, host, vhost = amqp_credentials(secrets[key])
        require(user == expected, f"{key} must use {expected}, not {user!r}")
        require(host.split(".")[0] == cluster["metadata"]["name"],
                f"{key} host {host} is not the cluster's service {cluster['metadata']['name']}")
        perms = check_login(state, user, password, vhost)
        if user == CONSUMER_USER:
            check_consumer_capabilities(perms, topology_prefix(config), user)
    return f"{load}/ <- {' then '.join(name for name, _ in files)}"


# ---------------------------------------------------------------------------
# Checks: observability (Grafana dashboard, README metrics catalog)
# ---------------------------------------------------------------------------

_METRIC_CALL = re.compile(r'metrics::(counter|gauge|histogram)!\(\s*"([a-z_:][a-z0-9_:]*)"')
_METRIC_TABLE = re.compile(r'\(\s*"(order_expiry_[a-z0-9_]+)",\s*"(counter|gauge|histogram)",\s*"([a-z_,]*)",')


@functools.cache
def code_metrics() -> dict[str, str]:
    """name -> kind of every metric the code records (metrics::counter!("...") etc.)."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.rs")):
        for kind, name in _METRIC_CALL.findall(path.read_text(encoding="utf-8")):
            require(found.get(name, kind) == kind, f"{name} is recorded as both {found.get(name)} and {kind}")
            found[name] = kind
    require(found, "no metrics:: calls found under src/")
    return found


@functools.cache
def described_metrics() -> dict[str, tuple[str, set[str]]]:
    """name -> (kind, labels) from telemetry::METRICS, the `# HELP` table."""
    text = read_text(SRC / "telemetry.rs")
    rows = _METRIC_TABLE.findall(text)
    require(rows, "cannot find the METRICS table in src/telemetry.rs")
    return {name: (kind, {l for l in labels.split(",") if l}) for name, kind, labels in rows}


def readme_section(title: str) -> str:
    text = read_text(README)
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    require(m, f"README.md has no '## {title}' section")
    return m.group(1)


@check("observability: README metrics catalog = metrics recorded in src/ = telemetry::METRICS")
def metrics_catalog():
    code, described = code_metrics(), described_metrics()
    require(set(code) == set(described),
            f"src/telemetry.rs METRICS and the code differ: only in code {sorted(set(code) - set(described))}, "
            f"only in METRICS {sorted(set(described) - set(code))}")
    for name, kind in code.items():
        require(described[name][0] == kind, f"{name}: METRICS says {described[name][0]}, the code records a {kind}")
    section = readme_section("Operations")
    rows = re.findall(r"^\|\s*`(order_expiry_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|([^|]*)\|", section, re.M)
    require(rows, "README Operations has no metrics catalog table (| `name` | type | labels | meaning |)")
    catalog = {name: (kind, {l.strip(" `") for l in labels.split(",") if l.strip(" `-")}, meaning.strip())
               for name, kind, labels, meaning in rows}
    require(set(catalog) == set(code),
            f"README catalog and the code differ: missing {sorted(set(code) - set(catalog))}, "
            f"unknown {sorted(set(catalog) - set(code))}")
    for name, (kind, labels, meaning) in catalog.items():
        require(kind == code[name], f"README: {name} is a {code[name]}, not a {kind}")
        require(labels == described[name][1], f"README: {name} labels {sorted(labels)} != {sorted(described[name][1])}")
        require(meaning, f"README: {name} has no meaning")
    return f"{len(catalog)} metrics"


@check("observability: README Operations covers definitions, passwords, compose, Kubernetes, TLS, alerts")
def readme_operations():
    section = readme_section("Operations")
    for needle, what in (
        ("rabbitmqctl import_definitions", "importing definitions"),
        ("rabbitmqctl change_password", "setting passwords"),
        (PUBLISHER_USER, "the publisher user"),
        (CONSUMER_USER, "the consumer user"),
        ("docker compose", "deploying with compose"),
        ("kubectl apply -k deploy/kubernetes", "deploying with Kubernetes"),
        ("amqps://", "TLS"),
        ("ORDER_EXPIRY__AMQP__TLS_CA_FILE", "the TLS CA setting"),
        ("deploy/grafana/order-expiry.json", "the dashboard"),
        ("/readyz", "readiness"),
        ("order_expiry_lateness_seconds", "lateness alert"),
        ("rabbitmq_queue_messages_ready", "due-queue depth alert"),
        ("order_expiry_retries_total", "retries alert"),
    ):
        require(needle in section, f"README Operations does not cover {what} ({needle!r})")
    require("(#operations)" in read_text(README), "README should link to #operations")
    return "definitions, passwords, compose, Kubernetes, TLS, dashboard, alerts"


def promql_metrics(expr: str) -> list[str]:
    return re.findall(r"\b((?:order_expiry|rabbitmq)_[a-z0-9_]+)\b", expr)


@check("observability: deploy/grafana/order-expiry.json parses and queries only metrics that exist")
def grafana_dashboard():
    try:
        dashboard = json.loads(read_text(GRAFANA_DASHBOARD))
    except json.JSONDecodeError as e:
        raise CheckFailed(f"{rel(GRAFANA_DASHBOARD)} is not JSON: {e}") from e
    require(dashboard.get("title") and dashboard.get("uid"), "dashboard needs a title and a uid")
    require(isinstance(dashboard.get("schemaVersion"), int), "dashboard needs a schemaVersion")
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list", [])}
    require((variables.get("datasource") or {}).get("type") == "datasource"
            and variables["datasource"].get("query") == "prometheus", "needs a Prometheus datasource variable")
    for var in ("vhost", "prefix"):
        require(var in variables, f"needs a ${var} variable")
    require(variables["vhost"].get("query") == default_settings()["topology"]["vhost"], "$vhost defaults to topology.vhost")
    require(variables["prefix"].get("query") == topology_prefix(), "$prefix defaults to topology.prefix")
    panels = dashboard.get("panels")
    require(isinstance(panels, list) and panels, "dashboard has no panels")
    code, described = code_metrics(), described_metrics()
    ids, exprs = set(), []
    for panel in panels:
        title = panel.get("title")
        require(title and panel.get("type") in ("timeseries", "stat", "gauge", "bargauge", "table"),
                f"panel {title!r}: needs a title and a known type")
        require(panel.get("id") not in ids, f"panel {title!r}: duplicate id")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos") or {}
        require(all(isinstance(grid.get(k), int) for k in "hwxy"), f"panel {title!r}: gridPos needs h, w, x, y")
        require((panel.get("datasource") or {}).get("uid") == "${datasource}", f"panel {title!r}: use the $datasource")
        targets = panel.get("targets") or []
        require(targets, f"panel {title!r} has no targets")
        for target in targets:
            expr = target.get("expr", "")
            for open_, close in ("()", "[]", "{}"):
                require(expr.count(open_) == expr.count(close), f"panel {title!r}: unbalanced {open_}{close} in {expr}")
            names = promql_metrics(expr)
            require(names, f"panel {title!r}: {expr!r} names no order_expiry_ or rabbitmq_ metric")
            labels = {"le"}
            for name in names:
                if name.startswith("rabbitmq_"):
                    require(name in RABBITMQ_PROMETHEUS_METRICS, f"panel {title!r}: {name} is not a rabbitmq_prometheus metric")
                    labels |= {"vhost", "queue"}
                    continue
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                base = base if base != name and code.get(base) == "histogram" else name
                require(base in code, f"panel {title!r}: {name} is not recorded by the code")
                require(base == name or code[base] == "histogram", f"panel {title!r}: {name}")
                labels |= described[base][1]
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                for label in (l.strip() for l in group.split(",") if l.strip()):
                    require(label in labels, f"panel {title!r}: label {label!r} does not exist on {names}")
            exprs.append(expr)
    joined = "\n".join(exprs)
    for needle, what in (
        ("rate(order_expiry_messages_total", "outcomes per second"),
        ("histogram_quantile(0.99, sum by (le) (rate(order_expiry_lateness_seconds_bucket", "lateness p99"),
        ('rabbitmq_queue_messages_ready{vhost="$vhost", queue="$prefix.due"}', "due-queue depth"),
        ('queue="$prefix.parked"', "parked count"),
    ):
        require(needle in joined, f"dashboard has no panel for {what} ({needle})")
    return f"{len(panels)} panels, {len(exprs)} queries"


# ---------------------------------------------------------------------------


def main() -> int:
    # Order: compose, broker and database files, Dockerfile; then one line per
    # Kubernetes manifest; then the Kubernetes cross-checks.
    cross = [c for c in CHECKS if c[0].startswith("kubernetes:")]
    checks = [c for c in CHECKS if c not in cross]
    del CHECKS[:]
    register_k8s_file_checks()
    checks += CHECKS + cross
    passed = failed = 0
    for name, fn in checks:
        try:
            detail = fn()
        except CheckFailed as e:
            failed += 1
            print(f"FAIL {name}\n     {e}")
        except Exception as e:  # a bug or an unexpected shape: report, keep going
            failed += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}\n     {type(e).__name__}: {e} (check_deploy.py:{where.lineno})")
        else:
            passed += 1
            print(f"ok   {name}" + (f" ({detail})" if detail else ""))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
