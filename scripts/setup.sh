#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install neardup with its test and Kafka extras, at
# the versions in requirements.lock (a constraints file; scripts/lock.sh refreshes it).
# Then, where cargo (Rust) is on PATH, build and install neardup-native (native/), the
# fingerprint stage in Rust: the same values as the Python path for about a third of its
# CPU (README, Figures). Without cargo the Python path is used, and this says so;
# NEARDUP_EXPECT_NATIVE=1 (CI) makes that an error instead.
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
native_stamp=.venv/.neardup-native-installed
if command -v cargo >/dev/null 2>&1; then
  if [ ! -f "$native_stamp" ] \
      || [ -n "$(find native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src \
                 -newer "$native_stamp" 2>/dev/null | head -n 1)" ]; then
    echo "setup: building neardup-native (native/) with $(cargo --version)" >&2
    if .venv/bin/python -m pip install -q ./native; then
      touch "$native_stamp"
    elif [ "${NEARDUP_EXPECT_NATIVE:-}" = 1 ]; then
      exit 1
    else  # an old Rust, say (native/ needs 1.85): the Python path still works
      # and an older build of native/ must not stay installed beside newer sources
      .venv/bin/python -m pip uninstall -q -y neardup-native 2>/dev/null || true
      echo "setup: native/ did not build (above); fingerprints are computed in Python" \
           "(the same values, more CPU a page)" >&2
    fi
  fi
elif [ "${NEARDUP_EXPECT_NATIVE:-}" = 1 ]; then
  echo "setup: NEARDUP_EXPECT_NATIVE=1 but there is no cargo to build native/" >&2
  exit 1
else
  echo "setup: no cargo on PATH: neardup-native is not built; fingerprints are computed" \
       "in Python (the same values, more CPU a page)" >&2
fi
