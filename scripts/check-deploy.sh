#!/usr/bin/env bash
# check-deploy.sh - validate the deployment files without a cluster or a Docker engine:
#   1. the Helm chart: `helm lint --strict` and `helm template` with the default values
#      and with SASL_SSL + ServiceMonitor + engine settings; every NEARDUP_* variable the
#      rendered manifests set must be a field of neardup/settings.py; values the chart must
#      refuse (replicas > partitions, SASL without a password, a password without SASL,
#      HTTP port 0, a stop grace past the pod's, a setting that is not one) must fail to
#      render;
#   2. docker-compose.yml: `docker compose config` where the compose plugin (or the older
#      docker-compose) is installed; it is skipped, with a note, where neither is;
#   3. tests/unit/test_deploy_files.py, which checks docker-compose.yml, the Dockerfile
#      and the chart's values against the settings in Python (needs pyyaml).
# helm comes from scripts/get-helm.sh (built once, then cached). Exits non-zero on any
# failure.
#
# Environment: PYTHON (default: .venv/bin/python), HELM (default: from get-helm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
CHART=helm/neardup
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
failures=0

log() { echo "check-deploy: $*" >&2; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

"$PYTHON" -c 'import yaml, neardup.settings' 2>/dev/null \
    || { log "$PYTHON cannot import yaml and neardup.settings (pip install -e '.[dev,kafka]')"; exit 1; }

# ---------------------------------------------------------------- helm

HELM="${HELM:-$(bash scripts/get-helm.sh)}"
log "helm $("$HELM" version --template '{{.Version}}')"

cat >"$OUT/sasl.yaml" <<'EOF'
replicaCount: 3
settings:
  brokers: kafka-0.kafka:9093,kafka-1.kafka:9093
  security_protocol: SASL_SSL
  sasl_mechanism: SCRAM-SHA-512
  sasl_username: neardup
  sasl_password: not-a-real-password
  ssl_cafile: /etc/neardup/ca/ca.crt
  engine:
    max_bytes: 10485760
    k1: 3
caBundle:
  secretName: kafka-ca
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
EOF
cat >"$OUT/existing-secret.yaml" <<'EOF'
settings:
  security_protocol: SASL_PLAINTEXT
  sasl_username: neardup
existingSecret:
  name: kafka-credentials
  key: password
persistence:
  enabled: false
EOF

for variant in default sasl existing-secret; do
    args=()
    [[ "$variant" != default ]] && args=(-f "$OUT/$variant.yaml")
    if "$HELM" lint --strict "$CHART" "${args[@]}" >"$OUT/lint-$variant.log" 2>&1; then
        log "helm lint ($variant): ok"
    else
        cat "$OUT/lint-$variant.log" >&2
        fail "helm lint ($variant)"
    fi
    if "$HELM" template neardup "$CHART" "${args[@]}" >"$OUT/$variant.rendered.yaml" \
        2>"$OUT/template-$variant.log"; then
        log "helm template ($variant): ok"
    else
        cat "$OUT/template-$variant.log" >&2
        fail "helm template ($variant)"
    fi
done

# What the rendered manifests must say, checked against the settings object itself.
if ! "$PYTHON" - "$OUT" <<'EOF'
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel

from neardup.settings import EngineSettings, Settings

out = Path(sys.argv[1])
known = set()
for name, field in Settings.model_fields.items():
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
        known |= {f"NEARDUP_{name.upper()}__{sub.upper()}" for sub in EngineSettings.model_fields}
    else:
        known.add(f"NEARDUP_{name.upper()}")

problems = []
for variant in ("default", "sasl", "existing-secret"):
    path = out / f"{variant}.rendered.yaml"
    if not path.exists() or not path.stat().st_size:
        continue  # its helm template failure is already counted
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    env = {}
    for name in kinds["ConfigMap"]["data"]:
        env[name] = "ConfigMap"
    sts = kinds["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for item in container.get("env", []):
        env[item["name"]] = "env"
    unknown = sorted(n for n in env if n.startswith("NEARDUP_") and n not in known)
    if unknown:
        problems.append(f"{variant}: not Settings fields: {unknown}")
    data = kinds["ConfigMap"]["data"]
    if "NEARDUP_SASL_PASSWORD" in data:
        problems.append(f"{variant}: the SASL password is in the ConfigMap")
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        problems.append(f"{variant}: podManagementPolicy is not Parallel")
    if sts["spec"]["replicas"] > int(data["NEARDUP_PARTITIONS"]):
        problems.append(f"{variant}: more replicas than partitions")
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    if paths != {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}:
        problems.append(f"{variant}: probes {paths}")
    (port,) = container["ports"]
    if str(port["containerPort"]) != data["NEARDUP_HTTP_PORT"]:
        problems.append(f"{variant}: container port is not NEARDUP_HTTP_PORT")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    if mounts.get("state") != data["NEARDUP_STATE_DIR"]:
        problems.append(f"{variant}: state volume is not at NEARDUP_STATE_DIR")
    instance = [i for i in container.get("env", []) if i["name"] == "NEARDUP_GROUP_INSTANCE_ID"]
    if [i["valueFrom"]["fieldRef"]["fieldPath"] for i in instance] != ["metadata.name"]:
        problems.append(f"{variant}: NEARDUP_GROUP_INSTANCE_ID is not the pod's name")
    if data.get("NEARDUP_SECURITY_PROTOCOL", "").startswith("SASL_") and env.get(
        "NEARDUP_SASL_PASSWORD"
    ) != "env":
        problems.append(f"{variant}: SASL without NEARDUP_SASL_PASSWORD from a Secret")
    if variant == "sasl" and "ServiceMonitor" not in kinds:
        problems.append("sasl: serviceMonitor.enabled rendered no ServiceMonitor")
    print(f"check-deploy: rendered {variant}: {len(docs)} objects, "
          f"{sum(n.startswith('NEARDUP_') for n in env)} NEARDUP_* variables", file=sys.stderr)
for problem in problems:
    print(f"check-deploy: FAIL: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
then
    fail "rendered manifests"
fi

# Values the chart must refuse to render, with the message an operator needs.
expect_refusal() {
    local what="$1" pattern="$2"
    shift 2
    if "$HELM" template neardup "$CHART" "$@" >/dev/null 2>"$OUT/refusal.log"; then
        fail "helm template accepted $what"
    elif ! grep -q -- "$pattern" "$OUT/refusal.log"; then
        cat "$OUT/refusal.log" >&2
        fail "helm template refused $what without saying '$pattern'"
    else
        log "refuses $what: ok"
    fi
}
expect_refusal "more replicas than partitions" "more than settings.partitions" \
    --set replicaCount=7 --set settings.partitions=6
expect_refusal "SASL without a password" "NEARDUP_SASL_PASSWORD" \
    --set settings.security_protocol=SASL_SSL --set settings.sasl_username=u
# Under a protocol without SASL the password is never read, yet the pods would wait for its
# Secret (existingSecret.name) or the chart would store it for nothing (sasl_password).
expect_refusal "existingSecret.name without SASL" "uses no SASL" \
    --set existingSecret.name=kafka-credentials
expect_refusal "settings.sasl_password without SASL" "uses no SASL" \
    --set settings.security_protocol=SSL --set settings.sasl_password=not-a-real-password
expect_refusal "an HTTP port of the kernel's choosing" "settings.http_port" --set settings.http_port=0
expect_refusal "a stop grace past Kubernetes' own" "terminationGracePeriodSeconds" \
    --set settings.stop_grace_s=90
expect_refusal "one instance id for every pod" "NEARDUP_GROUP_INSTANCE_ID" \
    --set settings.group_instance_id=worker
expect_refusal "an unknown setting" "additional properties" --set settings.log_levle=DEBUG
expect_refusal "an unknown engine setting" "additional properties" --set settings.engine.k3=1
expect_refusal "a bad security protocol" "security_protocol" --set settings.security_protocol=TLS

# ---------------------------------------------------------------- compose

if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
else
    compose=()
fi
if ((${#compose[@]})); then
    if "${compose[@]}" -f docker-compose.yml config --quiet \
        && "${compose[@]}" -f docker-compose.yml --profile tools config --services >/dev/null; then
        log "${compose[*]} config: ok"
    else
        fail "${compose[*]} config"
    fi
else
    log "no docker compose client here: docker-compose.yml is checked by the tests below only"
fi

# ---------------------------------------------------------------- settings drift

if "$PYTHON" -m pytest -q -p no:cacheprovider tests/unit/test_deploy_files.py >"$OUT/pytest.log" 2>&1; then
    log "tests/unit/test_deploy_files.py: $(tail -n 1 "$OUT/pytest.log")"
else
    cat "$OUT/pytest.log" >&2
    fail "tests/unit/test_deploy_files.py"
fi

if ((failures)); then
    log "$failures check(s) failed"
    exit 1
fi
log "all deployment checks passed"
