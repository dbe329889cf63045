"""The broker's files: rabbitmq.conf and enabled_plugins, definitions.json (its
objects and its least-privilege users), and a model of RabbitMQ's definitions
import that the compose and Kubernetes checks use to see who can log in."""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import unquote, urlsplit

from .common import (
    CONSUMER_USER, ENABLED_PLUGINS, PUBLISHER_USER, RABBITMQ_CONF, CheckFailed, check, default_settings,
    definitions, read_text, require, topology_prefix,
)


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


# The hashing algorithms RabbitMQ knows, with the length of their digest. The
# check stops at the shape of a hash: whether it is the password of a URL is
# RabbitMQ's to say, and tests/integration/deploy_users.rs asks the real broker
# (rabbitmqctl authenticate_user) for the committed development users file.
HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": 32,
    "rabbit_password_hashing_sha512": 64,
    "rabbit_password_hashing_md5": 16,
}


def password_checked(user: dict, password: str) -> str:
    """How far `user` of a users file can be checked against `password` offline:
    a plain-text password is compared; a hash must be base64 of a 4-byte salt
    and a digest of its algorithm's length."""
    if "password" in user:
        require(user["password"] == password, f"password of user {user['name']!r} does not match the URL's")
        return "plain text, matches"
    algorithm = user.get("hashing_algorithm", "rabbit_password_hashing_sha256")
    require(algorithm in HASHING_ALGORITHMS, f"user {user['name']!r}: unknown hashing_algorithm {algorithm!r}")
    try:
        raw = base64.b64decode(user["password_hash"], validate=True)
    except (ValueError, binascii.Error) as e:
        raise CheckFailed(f"user {user['name']!r}: password_hash is not base64: {e}") from e
    require(len(raw) == 4 + HASHING_ALGORITHMS[algorithm],
            f"user {user['name']!r}: password_hash is {len(raw)} bytes, not a 4-byte salt and a {algorithm} digest")
    return "hash of the right shape"


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
    password_checked(u, password)
    require(vhost in state["vhosts"], f"vhost {vhost!r} of the URL is not declared")
    perms = state["permissions"].get((user, vhost))
    require(perms, f"user {user!r} has no permissions on vhost {vhost!r}")
    return perms


def check_consumer_capabilities(perms: dict, prefix: str, user: str) -> None:
    """What `order-expiry serve` does with the broker (src/service/consumer/session.rs)."""
    due, parked = f"{prefix}.due", f"{prefix}.parked"
    for kind, names in (("configure", (due, parked)), ("write", (due, parked)), ("read", (due, parked))):
        for name in names:
            require(allows(perms[kind], name), f"{user!r} needs {kind} on {name} (the consumer re-declares it)")


# Checks: RabbitMQ and PostgreSQL files
# ---------------------------------------------------------------------------


# Whether RabbitMQ takes every key is for RabbitMQ to say: scripts/lib/deploy-broker.sh
# boots a real node with these files.
@check("rabbitmq: deploy/rabbitmq.conf parses and sets load_definitions")
def rabbitmq_conf_check():
    conf = rabbitmq_conf(read_text(RABBITMQ_CONF))
    load = conf.get("load_definitions")
    require(load and load.startswith("/etc/rabbitmq/"), "load_definitions must point under /etc/rabbitmq/")
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
    # Its own: the due and parked exchanges and queues, and the catch-up ones
    # when the topology has them (the due queue dead-letters there: declaring
    # it takes write on that exchange).
    own = {f"{prefix}.due", f"{prefix}.parked"} | ({f"{prefix}.catch-up"} & queues)
    # The consumer also sends messages through the ladder again (the next
    # payment check step, an order not found yet): write on the entries.
    may = {"configure": own, "write": own | entries, "read": own}
    for kind in ("configure", "write", "read"):
        for name in sorted(exchanges | queues):
            require(allows(consumer[kind], name) == (name in may[kind]),
                    f"consumer {kind} {'must' if name in may[kind] else 'must not'} match {name}")
    topic = {(t["user"], t["exchange"]): t for t in defs.get("topic_permissions", [])}
    due = topic.get((CONSUMER_USER, f"{prefix}.due"))
    require(due and due["vhost"] == vhost, f"the consumer needs a topic permission on exchange {prefix}.due")
    levels = len([x for x in exchanges if x.startswith(f"{prefix}.ladder.")])
    for key in ("", "#", "0.1", "0." * (levels - 1) + "1", "0." * levels + "0"):
        require(not re.search(due["write"], key), f"the consumer may not publish to {prefix}.due (key {key!r})")
    zero = ".".join(["0"] * levels)
    require(re.search(due["write"], zero), f"the consumer must publish to {prefix}.due with a zero delay's key")
    require(re.search(due["read"], "#"), f"the consumer must be able to bind {prefix}.due with '#'")
    return (f"vhost {vhost}; {PUBLISHER_USER}: write {len(entries)} entry exchanges; "
            f"{CONSUMER_USER}: {', '.join(sorted(own))}, write the same entries")
