"""deploy/Dockerfile and .dockerignore: a multi-stage build of the one binary,
a non-root runtime that stops on SIGTERM and reports health, every COPY source
present and not ignored, and every manifest the workspace needs in the builder.
hadolint lints the file first (tools.py); dockerfile-parse reads it here, and
.dockerignore is matched by docker-py, the Python port of Docker's own matcher
(both pinned in deploy/check-requirements.txt)."""

from __future__ import annotations

import functools
import json
import re
import shlex

from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser

from .common import (
    CONTAINER_UID, DOCKERFILE, DOCKERIGNORE, ROOT, CheckFailed, cargo_manifest, check, read_text, rel, require,
)


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
    """Stages of deploy/Dockerfile: base image (ARGs substituted), name and instructions."""
    parser = DockerfileParser(path=str(DOCKERFILE))
    images = iter(parser.parent_images)
    stages: list[dict] = []
    for item in parser.structure:
        keyword, rest = item["instruction"], item["value"]
        if keyword == "FROM":
            tokens = rest.split()
            name = tokens[2] if len(tokens) >= 3 and tokens[1].upper() == "AS" else None
            stages.append({"image": next(images), "name": name, "instructions": []})
        elif stages and keyword != "COMMENT":
            stages[-1]["instructions"].append((keyword, rest))
    return stages


@functools.cache
def dockerignore() -> PatternMatcher:
    """.dockerignore, read as `docker build` reads it."""
    lines = (line.strip() for line in read_text(DOCKERIGNORE).splitlines())
    return PatternMatcher([line for line in lines if line and not line.startswith("#")])


def dockerignored(path: str) -> bool:
    """Docker's rule (docker-py's port of moby's matcher): the last matching
    pattern wins, and a path is excluded when it or a parent directory is."""
    return dockerignore().matches(path.strip("/"))


@check("dockerfile: multi-stage build of `order-expiry` with cargo --release --locked")
def dockerfile_stages_check():
    stages = dockerfile_stages()
    require(len(stages) >= 2, f"{len(stages)} FROM: a multi-stage build needs at least two")
    builder, runtime = stages[0], stages[-1]
    require(re.fullmatch(r"rust:[\w.-]*bookworm[\w.-]*", builder["image"]), f"builder image {builder['image']} is not rust:*-bookworm")
    require(runtime["image"].startswith("debian:bookworm-slim"), f"runtime image {runtime['image']} is not debian:bookworm-slim")
    runs = " ".join(rest for k, rest in builder["instructions"] if k == "RUN")
    require(re.search(r"cargo build (?=.*--release)(?=.*--locked)", runs), "builder must run cargo build --release --locked")
    cargo = cargo_manifest()
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


@check("dockerfile: the builder gets every workspace manifest and every target path of order-expiry")
def dockerfile_cargo_targets():
    """cargo loads every workspace member's manifest (and wants their targets to
    exist) before it builds one package: the builder copies the members'
    Cargo.toml and stubs their targets; order-expiry's own target paths must be
    copied for real."""
    cargo = cargo_manifest()
    builder = dockerfile_stages()[0]
    copied, runs = [], []
    for keyword, rest in builder["instructions"]:
        if keyword == "COPY":
            flags, tokens = instruction_args(rest)
            if "from" not in flags:
                copied += [t.rstrip("/") for t in tokens[:-1]]
        elif keyword == "RUN":
            runs.append(rest)
    members = [m for m in cargo.get("workspace", {}).get("members", []) if m != "."]
    for member in members:
        manifest = f"{member}/Cargo.toml"
        require(manifest in copied or member in copied, f"deploy/Dockerfile does not copy {manifest} into the builder")
        for target in cargo_manifest(manifest).get("bin", []) + cargo_manifest(manifest).get("bench", []):
            path = target.get("path") or f"benches/{target['name']}.rs"
            require(f"{member}/{path}" in " ".join(runs) or member in copied,
                    f"the builder neither copies nor stubs {member}/{path}, which {manifest} names")
    paths = []
    if isinstance(cargo.get("package", {}).get("build"), str):
        paths.append(cargo["package"]["build"])
    if "path" in cargo.get("lib", {}):
        paths.append(cargo["lib"]["path"])
    for section in ("bin", "test", "bench", "example"):
        paths += [t["path"] for t in cargo.get(section, []) if "path" in t]
    for path in paths:
        require(any(path == c or path.startswith(c + "/") for c in copied),
                f"Cargo.toml names {path}, which deploy/Dockerfile does not copy into the builder")
    require(all("-p order-expiry" in r for r in runs if "cargo build" in r),
            "in a workspace the builder must build the one package: cargo build -p order-expiry")
    return f"{len(paths)} target paths under {', '.join(c for c in copied if '/' not in c)}; {len(members)} members stubbed"
