"""deploy/kubernetes: every manifest valid against the Kubernetes schemas of
the oldest and newest supported versions (custom resources structurally), the
kustomization complete, the deployment's probes, security and grace period,
selectors, KEDA on the due queue, and the RabbitmqCluster's boot import."""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import yaml

from .common import (
    CONSUMER_USER, CONTAINER_UID, DEPLOY_DOCS, K8S, PUBLISHER_USER, CheckFailed, check, definitions,
    default_settings, drain_timeout_s, listen_port, load_yaml_docs, read_text, require, topology_prefix,
)
from .rabbitmq import amqp_credentials, check_consumer_capabilities, check_login, imported, rabbitmq_conf

# Oldest and newest Kubernetes minor versions the manifests must validate against
# (schemas ship inside the pinned kubernetes-validate package).
K8S_VERSIONS = ["1.27.0", "1.37.0"]
EXAMPLE_SECRET_FILE = "secret.example.yaml"
DEFINITIONS_CONFIGMAP = "order-expiry-definitions"

# Kinds that are not built into Kubernetes, with the structural check for each.
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("rabbitmq.com/v1beta1", "RabbitmqCluster"),
}




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


def file_checks() -> list[tuple[str, object]]:
    """One check per manifest file: valid against the Kubernetes schemas, or
    structurally for the operators' custom resources."""
    files = sorted(p.name for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml") if K8S.is_dir() else []
    if not files:
        return [("kubernetes: manifests exist", lambda: require(False, "deploy/kubernetes/ has no manifests"))]
    versions = ", ".join(v.rsplit(".", 1)[0] for v in K8S_VERSIONS)
    return [(f"kubernetes: {file} valid (Kubernetes {versions}, strict)", k8s_file_check(file)) for file in files]


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
    readme = read_text(DEPLOY_DOCS)
    require(f"kubectl create configmap {DEFINITIONS_CONFIGMAP} --from-file=definitions.json" in readme,
            f"docs/src/operating/deploy.md must document `kubectl create configmap {DEFINITIONS_CONFIGMAP} --from-file=definitions.json`")
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


@check("kubernetes: the consumer's broker URLs name every node, the queues replicate over them")
def k8s_cluster_clients():
    """The consumer's ORDER_EXPIRY__AMQP__URL (a comma-separated list) names each
    pod of the RabbitmqCluster once (`<name>-server-N.<name>-nodes`), as the
    consumer user on the definitions' vhost; topology.replicas in the ConfigMap
    is the cluster's size; every quorum queue of definitions.json has that group
    size and a balanced leader locator (docs/src/operating/cluster.md)."""
    cluster = k8s_one("RabbitmqCluster")
    name, size = cluster["metadata"]["name"], cluster["spec"]["replicas"]
    deployment = k8s_one("Deployment", "order-expiry")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    ref = env["ORDER_EXPIRY__AMQP__URL"]["valueFrom"]["secretKeyRef"]
    urls = [u.strip() for u in secret_keys(ref["name"])[ref["key"]].split(",") if u.strip()]
    require(len(urls) == size, f"{ref['key']} lists {len(urls)} URLs, the cluster has {size} nodes")
    pods = set()
    vhosts = {v["name"] for v in definitions()["vhosts"]}
    for url in urls:
        user, _, host, vhost = amqp_credentials(url)
        require(user == CONSUMER_USER, f"{ref['key']}: {host} uses {user!r}, not {CONSUMER_USER}")
        require(vhost in vhosts, f"{ref['key']}: {host} names vhost {vhost!r}, not one of definitions.json")
        labels = host.split(".")
        require(len(labels) >= 2 and labels[1] == f"{name}-nodes",
                f"{ref['key']}: {host} is not a pod of the headless Service {name}-nodes")
        pods.add(labels[0])
    want = {f"{name}-server-{i}" for i in range(size)}
    require(pods == want, f"{ref['key']} names {sorted(pods)}, not every pod {sorted(want)}")
    config = k8s_one("ConfigMap", "order-expiry-config")["data"]
    replicas = int(config.get("ORDER_EXPIRY__TOPOLOGY__REPLICAS", default_settings()["topology"]["replicas"]))
    require(replicas == size, f"topology.replicas {replicas} is not the cluster's {size} nodes")
    quorum = [q for q in definitions()["queues"] if q["arguments"].get("x-queue-type") == "quorum"]
    require(quorum, "definitions.json has no quorum queue")
    for q in quorum:
        args = q["arguments"]
        require(args.get("x-quorum-initial-group-size") == replicas,
                f"{q['name']}: x-quorum-initial-group-size {args.get('x-quorum-initial-group-size')}, not {replicas}")
        require(args.get("x-queue-leader-locator") == "balanced", f"{q['name']}: leader locator is not balanced")
    return f"{len(urls)} nodes of {name}, {len(quorum)} quorum queues with {replicas} replicas, balanced leaders"
