"""docker-compose.yml, the Dockerfile and deploy/: parsed and checked against the code.

Docker does not run on these machines; this keeps the files honest: services and
ports, every QUANTDRIFT_* variable is a setting the code reads, Prometheus
scrapes the port the worker serves, the dashboard queries metrics that exist.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from quantdrift.config import DEV_KEY, Settings, require_safe_signing

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def setting_paths(model: type[BaseModel], prefix: str = "QUANTDRIFT_") -> set[str]:
    """Every env name Settings reads, with the nested delimiter ``__``."""
    names = set()
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        names.add(env)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            names |= setting_paths(ann, env + "__")
    return names


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def published(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port."""
    rows = []
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"{spec}: publish with an explicit host address"
        rows.append((parts[0], parts[1], parts[2]))
    return rows


def test_services_and_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {
        "kafka",
        "redis",
        "worker",
        "gateway",
        "alerts",
        "alertmanager",
        "prometheus",
        "grafana",
    } <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert "zookeeper" not in services
    # --scale worker=N: no fixed name, no host ports
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert "worker" in worker["command"]
    gateway = services["gateway"]
    assert gateway["command"][:3] == ["gateway", "--config", "/etc/quantdrift/gateway.yaml"]
    assert ("127.0.0.1", "8080", "8080") in published(gateway)
    assert ("127.0.0.1", "9090", "9090") in published(services["prometheus"])
    assert ("127.0.0.1", "3000", "3000") in published(services["grafana"])
    host_ports = [port for s in services.values() for _, port, _ in published(s)]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"


def test_nothing_unauthenticated_is_published_beyond_loopback(compose: dict[str, Any]) -> None:
    """The broker, Prometheus and Alertmanager have no auth in compose: loopback at most."""
    for name, service in compose["services"].items():
        for address, port, _ in published(service):
            assert address == "127.0.0.1", f"{name} publishes {port} on {address!r}"
    assert "ports" not in compose["services"]["redis"]


def test_alert_forwarder_and_rules_are_wired(compose: dict[str, Any]) -> None:
    services = compose["services"]
    alerts = services["alerts"]
    assert alerts["command"][:2] == ["alerts", "forward"]
    url = alerts["command"][alerts["command"].index("--alertmanager") + 1]
    assert url == "http://alertmanager:9093"
    assert "alertmanager" in alerts["depends_on"]
    # No port to probe: the image's HEALTHCHECK (the worker's) must not mark it unhealthy.
    assert alerts["healthcheck"] == {"disable": True}
    prom_mounts = {str(v).split(":")[1] for v in services["prometheus"]["volumes"]}
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/alerts.yml"} <= prom_mounts
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert prom["rule_files"] == ["alerts.yml"]
    targets = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager:9093"]
    am = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    assert am["route"]["receiver"] in {r["name"] for r in am["receivers"]}


def test_long_running_services_get_time_to_stop(compose: dict[str, Any]) -> None:
    """Docker's default 10 s cuts a worker's commit or a gateway's open streams short."""
    for name in ("worker", "gateway", "alerts"):
        grace = str(compose["services"][name]["stop_grace_period"])
        assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) >= 20, name


def test_every_quantdrift_variable_is_a_setting(compose: dict[str, Any]) -> None:
    known = setting_paths(Settings)
    used = {
        (name, service)
        for service, spec in compose["services"].items()
        for name in environment(spec)
        if name.startswith("QUANTDRIFT_")
    }
    assert used, "no QUANTDRIFT_* variables at all?"
    unknown = sorted(f"{service}: {name}" for name, service in used if name not in known)
    assert not unknown, f"not settings the code reads: {unknown}"


def test_settings_parse_from_the_compose_environment(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values too: what the worker gets must validate (defaults for ${VAR:-default};
    the operator's own values for the required ${VAR:?message})."""
    operator = {
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "k2026",
        "QUANTDRIFT_SIGNING__KEYS": '{"k2026": "a-real-secret-of-at-least-32-bytes"}',
    }
    env = environment(compose["services"]["worker"])
    for name, value in env.items():
        if name.startswith("QUANTDRIFT_"):
            default = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", value)
            required = re.fullmatch(r"\$\{([A-Z_]+):\?.*\}", value)
            # The operator sets the very names Settings reads: one name per setting.
            assert required is None or required.group(1) == name, (name, value)
            if required:
                value = operator[required.group(1)]
            elif default:
                value = default.group(1)
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.redis.url == "redis://redis:6379/0"
    assert settings.signing.active_key_id in settings.signing.keys
    require_safe_signing(settings, settings.redis.url or "")


def test_no_dev_key_fallback_and_durable_state(compose: dict[str, Any]) -> None:
    """Compose never falls back to the public dev key; Kafka and Redis keep their data."""
    text = COMPOSE.read_text()
    assert DEV_KEY not in text
    env = compose["x-quantdrift-env"]
    assert env["QUANTDRIFT_SIGNING__KEYS"].startswith("${QUANTDRIFT_SIGNING__KEYS:?")
    kafka = compose["services"]["kafka"]
    assert kafka["environment"]["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert any(str(v).endswith(":/var/lib/kafka/data") for v in kafka["volumes"])
    assert kafka["environment"]["CLUSTER_ID"]
    redis_cmd = compose["services"]["redis"]["command"]
    assert "--appendonly" in redis_cmd and "--appendfsync" in redis_cmd
    for name in ("kafka", "redis", "worker", "gateway"):
        assert "healthcheck" in compose["services"][name], name


def test_mounted_files_exist(compose: dict[str, Any]) -> None:
    for spec in compose["services"].values():
        for volume in spec.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"missing {source}"


def test_prometheus_scrapes_the_worker_port(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "quantdrift-worker")
    assert job["metrics_path"] == "/metrics"
    sd = job["dns_sd_configs"][0]
    assert sd["names"] == ["worker"]
    assert str(sd["port"]) in compose["services"]["worker"]["command"]


def test_dashboard_queries_metrics_the_worker_exports() -> None:
    from quantdrift.breaker.state import RouteState
    from quantdrift.status.page import LatencyHistogram, metrics_text
    from quantdrift.streams.agents import WorkerStats

    exported = set(
        re.findall(
            r"^# TYPE (\S+)",
            metrics_text(WorkerStats(), {"r": RouteState()}, LatencyHistogram(), {"t/0": 1}),
            re.M,
        )
    )
    dash = json.loads((ROOT / "deploy/grafana/dashboards/quantdrift.json").read_text())
    queried = {
        name
        for panel in dash["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(quantdrift_[a-z_]+)", target["expr"])
    }
    assert queried
    for name in queried:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert base in exported, f"dashboard queries {name}, which no worker exports"
    ds = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert ds["datasources"][0]["uid"] == "prometheus"


def test_dockerfile_pins_cpu_torch_first() -> None:
    text = (ROOT / "Dockerfile").read_text()
    torch = text.index("torch==2.13.0")
    assert torch < text.index("COPY src")
    assert 'ENTRYPOINT ["quantdrift"]' in text


def _compose_cli() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, timeout=20)
        if probe.returncode == 0:
            return cmd
    return None


def test_docker_compose_config_is_valid() -> None:
    cmd = _compose_cli()
    if cmd is None:
        pytest.skip("no docker compose client here (docker compose / docker-compose absent)")
    out = subprocess.run(
        [*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()


# -- Kubernetes (deploy/k8s): validated offline against the API schemas ------------------

K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release still in wide use, and the newest the validator knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")


def k8s_objects() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    return next(o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate_offline(version: str) -> None:
    import kubernetes_validate

    objects = k8s_objects()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("Deployment", "quantdrift-gateway"),
        ("Service", "quantdrift-gateway"),
        ("Deployment", "quantdrift-worker"),
        ("Job", "quantdrift-topics"),
    } <= kinds
    for obj in objects:
        # strict: an unknown field (a typo) fails too, not only a wrong type.
        kubernetes_validate.validate(obj, version, strict=True)


def test_k8s_settings_are_settings_the_code_reads() -> None:
    known = setting_paths(Settings)
    env = k8s_object("ConfigMap", "quantdrift-env")["data"]
    names = set(env)
    for obj in k8s_objects():
        if obj["kind"] == "Deployment":
            names |= {e["name"] for e in container(obj).get("env", [])}
    used = {n for n in names if n.startswith("QUANTDRIFT_")}
    assert used and not sorted(used - known), sorted(used - known)


def test_k8s_matches_the_image_and_the_code() -> None:
    from quantdrift.config import TopicNames

    worker = k8s_object("Deployment", "quantdrift-worker")
    gateway = k8s_object("Deployment", "quantdrift-gateway")
    docker = (ROOT / "Dockerfile").read_text()
    workdir = re.findall(r"^WORKDIR (\S+)", docker, re.M)[-1]
    for deployment in (worker, gateway):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert f"--uid {pod['securityContext']['runAsUser']}" in docker
        mounts = {m["mountPath"] for m in container(deployment)["volumeMounts"]}
        # The root filesystem is read-only: the image's data directory must be a volume.
        assert container(deployment)["securityContext"]["readOnlyRootFilesystem"] is True
        assert workdir in mounts and "/tmp" in mounts
        assert pod["terminationGracePeriodSeconds"] >= 20
    w = container(worker)
    assert w["args"] == ["worker", "--web-port", "6066"]
    assert w["readinessProbe"]["httpGet"]["path"] == "/healthz"
    g = container(gateway)
    assert g["args"][:3] == ["gateway", "--config", "/etc/quantdrift/gateway.yaml"]
    assert g["readinessProbe"]["httpGet"]["path"] == "/health"
    service = k8s_object("Service", "quantdrift-gateway")
    assert service["spec"]["selector"] == gateway["spec"]["selector"]["matchLabels"]
    job = container(k8s_object("Job", "quantdrift-topics"))
    topics = next(e["value"] for e in job["env"] if e["name"] == "TOPICS").split()
    assert sorted(topics) == sorted(TopicNames().model_dump().values())
