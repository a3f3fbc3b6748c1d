"""The deployment files stay in step with neardup/settings.py.

Settings ignores unknown NEARDUP_* variables (extra="ignore"), so a misspelt or renamed
variable in docker-compose.yml or the Helm chart would be dropped without a word at run
time; these tests make that drift fail here instead.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from neardup.settings import EngineSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CHART = ROOT / "helm" / "neardup"
_REFERENCE = re.compile(r"\$\$?\{?(NEARDUP_[A-Z0-9_]+)")


def settings_env_names() -> set[str]:
    """Every variable Settings reads: NEARDUP_<FIELD>, and NEARDUP_ENGINE__<FIELD>."""
    names = set()
    for name, field in Settings.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names |= {
                f"NEARDUP_{name.upper()}__{sub.upper()}" for sub in EngineSettings.model_fields
            }
        else:
            names.add(f"NEARDUP_{name.upper()}")
    return names


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in list(os.environ):
        if name.startswith("NEARDUP_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return doc


def test_env_names_cover_engine_fields() -> None:
    names = settings_env_names()
    assert {"NEARDUP_BROKERS", "NEARDUP_SASL_PASSWORD", "NEARDUP_ENGINE__K1"} <= names
    assert "NEARDUP_ENGINE" not in names


def test_compose_sets_only_settings_variables(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    known = settings_env_names()
    for name, service in compose["services"].items():
        env = _environment(service)
        ours = {k: v for k, v in env.items() if k.startswith("NEARDUP_")}
        assert set(ours) <= known, f"{name}: not Settings fields: {sorted(set(ours) - known)}"
        # The values must pass the worker's own validation, not just the names.
        _settings_from(ours, monkeypatch)
        # A variable a command refers to must be one the service sets.
        referred = set(_REFERENCE.findall(json.dumps(service.get("command", ""))))
        assert referred <= set(ours), f"{name}: command uses unset {sorted(referred - set(ours))}"


def test_compose_worker_is_wired_to_its_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = compose["services"]["worker"]
    settings = _settings_from(_environment(worker), monkeypatch)
    assert settings.http_host == "0.0.0.0"
    assert f":{settings.http_port}/readyz" in " ".join(worker["healthcheck"]["test"])
    assert any(v.endswith(f":{settings.state_dir}") for v in worker["volumes"])
    assert any(p.endswith(f":{settings.http_port}") for p in worker["ports"])
    broker_host = settings.brokers.split(":")[0]
    assert compose["services"][broker_host]["hostname"] == broker_host
    producer = compose["services"]["producer"]
    assert producer["command"][:3] == ["python", "-m", "neardup.produce"]
    assert producer["command"][3] in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_dockerfile_sets_only_settings_variables() -> None:
    """The worker's environment (ENV); a RUN line's variables are the build's own."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    env = " ".join(line for line in text.splitlines() if line.startswith("ENV "))
    names = set(re.findall(r"\b(NEARDUP_[A-Z0-9_]+)=", env))
    assert names, "the Dockerfile sets NEARDUP_HTTP_HOST and NEARDUP_STATE_DIR"
    assert names <= settings_env_names(), sorted(names - settings_env_names())


def _chart_env(settings: dict[str, Any]) -> dict[str, str]:
    """What the chart's ConfigMap and Secret render from values.settings."""
    env = {}
    for key, value in settings.items():
        if key == "engine":
            for sub, sub_value in (value or {}).items():
                if sub_value not in (None, ""):
                    env[f"NEARDUP_ENGINE__{sub.upper()}"] = str(sub_value)
        elif value not in (None, ""):
            env[f"NEARDUP_{key.upper()}"] = str(value)
    return env


def test_values_map_one_to_one_onto_settings(
    values: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = values["settings"]
    assert set(settings) == set(Settings.model_fields)
    assert set(settings["engine"] or {}) <= set(EngineSettings.model_fields)
    env = _chart_env(settings)
    assert set(env) <= settings_env_names()
    parsed = _settings_from(env, monkeypatch)
    assert parsed.http_host == "0.0.0.0"  # probes and Prometheus reach the pod


def test_values_comments_name_each_variable() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        if name != "engine":
            assert f"# NEARDUP_{name.upper()}" in text, f"values.yaml: no comment for {name}"
    for name in EngineSettings.model_fields:
        assert f"# NEARDUP_ENGINE__{name.upper()}" in text


def test_values_schema_matches_settings() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    props = schema["properties"]["settings"]["properties"]
    model = Settings.model_json_schema()
    assert set(props) == set(model["properties"])
    for name, prop in props.items():
        if name == "engine":
            assert set(prop["properties"]) == set(EngineSettings.model_fields)
            continue
        assert prop["description"] == f"NEARDUP_{name.upper()}"
        want = model["properties"][name]
        got = prop if "type" in prop else prop["anyOf"][0]
        for bound in ("enum", "minimum", "maximum"):
            assert got.get(bound) == want.get(bound), f"{name}.{bound}"


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    """.dockerignore is an allow-list: a file the Dockerfile copies (requirements.lock, say)
    but the list leaves out would break `docker build`, which cannot run here."""
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    copied = []
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied += words[1:-1]
    assert "requirements.lock" in copied
    assert sorted(set(copied) - allowed) == []
    assert all((ROOT / path).exists() for path in copied)


def test_the_image_installs_one_wheel_built_with_the_native_module() -> None:
    """The wheel stage builds neardup itself, its build hook compiling native/ or failing
    (NEARDUP_EXPECT_NATIVE=1), and the image checks the native path is the one taken."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    (wheel,) = [line for line in text.splitlines() if " wheel " in line and "pip" in line]
    assert "NEARDUP_EXPECT_NATIVE=1" in wheel
    assert wheel.split()[-3:] == [".", "-w", "/wheels"]  # the project, not native/ alone
    copied = " ".join(line for line in text.splitlines() if line.startswith("COPY "))
    assert "hatch_build.py" in copied and "native/src" in copied
    assert "fingerprint_path() == 'native'" in text


def _names_a_log_level(command: list[str]) -> bool:
    return any(a == "--loglevel" or a.startswith(("--loglevel=", "-l")) for a in command)


def test_the_worker_commands_leave_the_log_level_to_the_settings(
    compose: dict[str, Any],
) -> None:
    """A ``-l`` on the worker's command line overrides NEARDUP_LOG_LEVEL, so the chart's
    settings.log_level would do nothing."""
    commands = {"docker-compose.yml": compose["services"]["worker"]["command"]}
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("CMD "):
            commands["Dockerfile"] = json.loads(line[len("CMD ") :])
    sts = (CHART / "templates" / "statefulset.yaml").read_text(encoding="utf-8")
    (args,) = re.findall(r"^\s*args: (\[.*\])$", sts, re.MULTILINE)
    commands["statefulset.yaml"] = json.loads(args)
    for where, command in commands.items():
        assert command[:4] == ["python", "-m", "neardup.kafka", "worker"], where
        assert not _names_a_log_level(command), f"{where}: {command}"


def test_the_chart_probes_the_workers_endpoint_and_keeps_a_volume_per_pod(
    values: dict[str, Any],
) -> None:
    """Liveness on /healthz and readiness on /readyz of the container port that is
    NEARDUP_HTTP_PORT, and each pod's own state volume mounted at NEARDUP_STATE_DIR (a task
    that moves restores its store from the changelog; one that stays keeps it)."""
    sts = (CHART / "templates" / "statefulset.yaml").read_text(encoding="utf-8")
    assert "kind: StatefulSet" in sts
    assert re.search(r"containerPort: \{\{ int \$s\.http_port \}\}", sts)
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        block = re.search(rf"{probe}:\n\s+httpGet:\n\s+path: (\S+)\n\s+port: (\S+)", sts)
        assert block is not None, probe
        assert block.groups() == (path, "metrics"), probe
    assert re.search(r"- name: state\n\s+mountPath: \{\{ \$s\.state_dir \}\}", sts)
    claims = sts[sts.index("volumeClaimTemplates:") :]
    assert re.search(r"name: state\b", claims)
    assert values["persistence"]["enabled"] is True
    assert values["settings"]["state_dir"].startswith("/")


def test_the_deployment_files_name_no_routed_worker() -> None:
    """One topology: nothing sets or explains the routed worker's settings or Faust."""
    files = [COMPOSE, ROOT / "Dockerfile", *CHART.rglob("*")]
    for path in files:
        if path.is_file():
            text = path.read_text(encoding="utf-8").lower()
            for word in ("neardup_topology", "faust", "sequencer", "standby"):
                assert word not in text, f"{path.relative_to(ROOT)} names {word}"


def test_compose_reads_the_outputs_committed_only(compose: dict[str, Any]) -> None:
    """The worker writes in transactions: the decisions tool reads read_committed, as
    every downstream consumer must (an aborted transaction's records are in the log)."""
    command = " ".join(compose["services"]["decisions"]["command"])
    assert "--isolation-level read_committed" in command
