"""Offline checks of the deployment artifacts, one module per artifact.

Run them through scripts/check-deploy, which installs the pinned tools
(deploy/check-requirements.txt in target/deploy-venv, promtool in
target/tools) and runs the ones that need no help first (yamllint,
check-jsonschema, hadolint, promtool). Nothing here touches the network or Docker.

- common: loading, small parsers, the check registry.
- compose: docker-compose.yml.
- rabbitmq: rabbitmq.conf, enabled_plugins, definitions.json, users files.
- dockerfile: deploy/Dockerfile and .dockerignore.
- kubernetes: deploy/kubernetes/*.
- grafana: the dashboard's structure, its queries parsed by promtool, and the
  broker metrics it queries.
- versions: the RabbitMQ release line compose and Kubernetes pin (the tested one).

These modules keep what no tool knows: how the files fit each other and the
code (ports, users and passwords, mounts, grace periods, selectors).
What compares the artifacts with the Rust code lives in Rust tests instead:
the book's metrics catalog (docs/src/operating/metrics.md) and the dashboard's order_expiry_* queries
(src/telemetry/catalog.rs), the README (tests/integration/docs.rs), and
the password hashes of the users files, verified by the real broker
(tests/integration/deploy_users.rs).
"""
