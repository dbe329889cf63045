"""Loading and small parsers shared by the checks, and the check registry."""

from __future__ import annotations

import functools
import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
RABBITMQ_CONF = DEPLOY / "rabbitmq.conf"
ENABLED_PLUGINS = DEPLOY / "enabled_plugins"
DEFINITIONS = ROOT / "definitions.json"
MIGRATIONS = ROOT / "migrations"
DEPLOY_DOCS = ROOT / "docs" / "src" / "operating" / "deploy.md"
GRAFANA_DASHBOARD = DEPLOY / "grafana" / "order-expiry.json"

# The least-privilege users of definitions.json (src/topology/access.rs).
PUBLISHER_USER = "order-expiry-publisher"
CONSUMER_USER = "order-expiry-consumer"

CONTAINER_UID = 10001


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


@functools.cache
def cargo_manifest(path: str = "Cargo.toml") -> dict:
    return tomllib.loads(read_text(ROOT / path))
