#!/usr/bin/env bash
# audit.sh - known vulnerabilities in the locked dependencies (requirements.lock), for CI.
#   1. .venv must hold exactly the locked versions (scripts/lock.sh --check): what is
#      audited is what the tests ran with;
#   2. pip-audit, pinned, is installed into a venv of its own (.venv-audit), so that its
#      dependencies neither mix with the project's nor change what is audited;
#   3. scripts/audit.py audits every locked version (pip-audit, then PyPI's project JSON
#      for what pip-audit cannot reach) and fails on any finding, or version it could not
#      audit, that scripts/audit-exceptions.txt does not justify;
#   4. scripts/audit_crates.py checks that no crate version in native/Cargo.lock is
#      yanked from crates.io (through its sparse index). The RustSec advisories are not
#      reachable from here, so the crates' known vulnerabilities are not audited.
# Needs network access to PyPI and index.crates.io. Environment: PYTHON (default: python3), AUDIT_VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP_AUDIT_VERSION=2.10.1
PYTHON=${PYTHON:-python3}
AUDIT_VENV=${AUDIT_VENV:-.venv-audit}

bash scripts/lock.sh --check
if ! "$AUDIT_VENV/bin/pip-audit" --version 2>/dev/null | grep -qx "pip-audit $PIP_AUDIT_VERSION"; then
    "$PYTHON" -m venv "$AUDIT_VENV"
    "$AUDIT_VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "pip-audit==$PIP_AUDIT_VERSION"
fi
echo "audit: $("$AUDIT_VENV/bin/pip-audit" --version) over requirements.lock" >&2
# both run whatever the first finds; the script fails if either does
status=0
"$AUDIT_VENV/bin/python" scripts/audit.py "$AUDIT_VENV/bin/pip-audit" \
    --lock requirements.lock --exceptions scripts/audit-exceptions.txt || status=1
"$PYTHON" scripts/audit_crates.py --lock native/Cargo.lock || status=1
exit "$status"
