#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install neardup with its test and Kafka extras, at
# the versions in requirements.lock (a constraints file; scripts/lock.sh refreshes it).
# Idempotent: a second run only checks. Honours PYTHON (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.neardup-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements.lock -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev,kafka]" -c requirements.lock
  touch "$stamp"
fi
