#!/usr/bin/env bash
# The test command: set up .venv, then lint, type-check and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check worker tests bench scripts
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
