"""The RabbitMQ version deploy/ pins: docker-compose.yml and the RabbitmqCluster
run the release line scripts/test tests as the primary broker (4.3, on a
Debian forky node; README, Broker versions tested), and the deployed-broker
check (scripts/lib/deploy-broker.sh) boots the compose files on that line."""

from __future__ import annotations

import re

from .common import ROOT, check, read_text, require
from .compose import service
from .kubernetes import k8s_one

# The release line scripts/test runs every suite on besides 3.10.
TESTED_LINE = "4.3"
# A tag of that line with the management plugin: 4.3-management, 4.3.6-management.
PINNED = re.compile(rf"rabbitmq:{re.escape(TESTED_LINE)}(\.\d+)?-management")


@check(f"kubernetes: compose and the RabbitmqCluster pin RabbitMQ {TESTED_LINE}, the version scripts/test tests")
def pinned_rabbitmq():
    compose_image = str(service("rabbitmq").get("image", ""))
    require(PINNED.fullmatch(compose_image),
            f"docker-compose.yml runs {compose_image!r}, not rabbitmq:{TESTED_LINE}[.N]-management")
    cluster_image = str((k8s_one("RabbitmqCluster").get("spec") or {}).get("image", ""))
    require(PINNED.fullmatch(cluster_image),
            f"deploy/kubernetes: the RabbitmqCluster runs {cluster_image!r}, not rabbitmq:{TESTED_LINE}[.N]-management")
    script = read_text(ROOT / "scripts" / "lib" / "deploy-broker.sh")
    require("ORDER_EXPIRY_RMQ4_SUITE:-forky" in script,
            "scripts/lib/deploy-broker.sh must boot the deployed files on the 4.3 (forky) node by default")
    return f"{compose_image}, {cluster_image}"
