"""docker-compose.yml: valid against the compose specification, every mounted
path present, start-up order, the consumer's settings and grace period, and the
broker users the consumer, the demo and a host-side publisher log in as."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .common import (
    COMPOSE_FILE, CONSUMER_USER, DEPLOY_DOCS, DOCKERFILE, MIGRATIONS, PUBLISHER_USER, RABBITMQ_CONF, ROOT,
    CheckFailed, check, drain_timeout_s, listen_port, load_yaml_docs, read_text, rel, require, topology_prefix,
)
from .rabbitmq import amqp_credentials, check_consumer_capabilities, check_login, imported, rabbitmq_conf


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


# Checks: docker-compose.yml
# ---------------------------------------------------------------------------


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
    initdb = [h for h, c, _ in bind_mounts(service("postgres")) if c.rstrip("/") == "/docker-entrypoint-initdb.d"]
    require(initdb and (ROOT / initdb[0]).resolve() == MIGRATIONS.resolve(),
            "postgres must mount migrations/ (the schema of `order-expiry migrate`) at /docker-entrypoint-initdb.d")
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
    documented = re.findall(r"amqps?://[^\s`'\"]+", read_text(DEPLOY_DOCS))
    publisher_urls = [u for u in documented if amqp_credentials(u)[0] == PUBLISHER_USER]
    require(publisher_urls, f"docs/src/operating/deploy.md documents no {PUBLISHER_USER} URL for the compose broker")
    for url in publisher_urls:
        user, password, _, vhost = amqp_credentials(url)
        check_login(state, user, password, vhost)
    checked.append(f"{PUBLISHER_USER} as documented")
    if "guest" in (user, demo_user):
        require(rabbitmq_conf(read_text(RABBITMQ_CONF)).get("loopback_users.guest") == "false",
                "guest connects from another container: set loopback_users.guest = false")
    return f"{', '.join(checked)}; import order {' then '.join(Path(c).name for c, _, _ in files)}"


COLLECTOR_CONFIG = "./deploy/otel-collector/config.yaml"


@check("compose: the opt-in collector takes the consumer's OTLP/HTTP spans")
def compose_otel_collector():
    """Span export stays off by default (the consumer's endpoint variable is
    empty unless set); under the "tracing" profile the collector mounts its
    config, and that config takes OTLP/HTTP on 4318 into a traces pipeline
    whose every stage is defined."""
    collector = service("otel-collector")
    require("tracing" in (collector.get("profiles") or []), "otel-collector must be under profiles: [tracing]")
    require(str(collector.get("image", "")).startswith("otel/opentelemetry-collector"),
            "otel-collector should run an otel/opentelemetry-collector image")
    mounts = {container: host for host, container, _ in bind_mounts(collector)}
    command = " ".join(collector.get("command") or [])
    config_path = re.search(r"--config[= ](\S+)", command)
    require(config_path, "otel-collector: command must name its --config")
    require(mounts.get(config_path.group(1)) == COLLECTOR_CONFIG,
            f"otel-collector: {COLLECTOR_CONFIG} must be mounted at {config_path.group(1)}")
    docs = load_yaml_docs(ROOT / COLLECTOR_CONFIG)
    require(len(docs) == 1 and isinstance(docs[0], dict), f"{COLLECTOR_CONFIG} must be one YAML mapping")
    config = docs[0]
    http = (((config.get("receivers") or {}).get("otlp") or {}).get("protocols") or {}).get("http") or {}
    require(str(http.get("endpoint", "")).endswith(":4318"), f"{COLLECTOR_CONFIG}: the otlp receiver must take HTTP on :4318")
    traces = (((config.get("service") or {}).get("pipelines") or {}).get("traces")) or {}
    require("otlp" in (traces.get("receivers") or []), f"{COLLECTOR_CONFIG}: the traces pipeline must receive otlp")
    for stage in ("receivers", "processors", "exporters"):
        for name in traces.get(stage) or []:
            require(name in (config.get(stage) or {}), f"{COLLECTOR_CONFIG}: traces pipeline uses undefined {stage[:-1]} {name}")
    require(traces.get("exporters"), f"{COLLECTOR_CONFIG}: the traces pipeline exports nowhere")
    env = environment(service("consumer"))
    require("OTEL_EXPORTER_OTLP_ENDPOINT" in env, "consumer: OTEL_EXPORTER_OTLP_ENDPOINT must be passed through")
    require(env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "", "consumer: span export must be off by default (empty endpoint)")
    require("OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318" in read_text(COMPOSE_FILE),
            "docker-compose.yml must say how to point the consumer at the collector")
    return f"{collector['image']}, traces: {' -> '.join('/'.join(traces.get(s) or []) for s in ('receivers', 'processors', 'exporters'))}"
