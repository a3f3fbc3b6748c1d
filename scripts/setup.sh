#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install neardup, editable, with its test and Kafka
# extras, at the versions in requirements.lock (a constraints file; scripts/lock.sh
# refreshes it). Where cargo (Rust) is on PATH, installing builds the fingerprint stage in
# Rust (native/) into the package (hatch_build.py): the same values as the Python path
# for about a third of its CPU. Without cargo the Python path is used, and this says so;
# NEARDUP_EXPECT_NATIVE=1 (CI) makes that an error instead.
# Idempotent: a second run only checks. Honours PYTHON (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.neardup-installed
sources="pyproject.toml requirements.lock hatch_build.py native/Cargo.toml native/Cargo.lock native/src"
has_cargo() { command -v cargo >/dev/null 2>&1; }
has_native() {
  NEARDUP_NATIVE=1 .venv/bin/python -c \
    "import sys; from neardup.fingerprint import native; sys.exit(native() is None)" 2>/dev/null
}
# shellcheck disable=SC2086  # $sources is a list of paths without spaces
if [ ! -f "$stamp" ] || [ -n "$(find $sources -newer "$stamp" 2>/dev/null | head -n 1)" ] \
    || { has_cargo && ! has_native; }; then
  if has_cargo; then
    echo "setup: installing neardup, its native module (native/) built with" \
         "$(cargo --version)" >&2
  elif [ "${NEARDUP_EXPECT_NATIVE:-}" = 1 ]; then
    echo "setup: NEARDUP_EXPECT_NATIVE=1 but there is no cargo to build native/" >&2
    exit 1
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  # the build hook fails the install here if NEARDUP_EXPECT_NATIVE=1 and native/ fails
  .venv/bin/python -m pip install -q -e ".[dev,kafka]" -c requirements.lock
  # neardup imports its own neardup._native; a separately installed neardup-native
  # package is never used
  .venv/bin/python -m pip uninstall -q -y neardup-native 2>/dev/null || true
  touch "$stamp"
fi
if has_native; then
  exit 0
elif [ "${NEARDUP_EXPECT_NATIVE:-}" = 1 ]; then
  echo "setup: NEARDUP_EXPECT_NATIVE=1 but neardup._native is not importable" >&2
  exit 1
elif has_cargo; then  # an old Rust, say (native/ needs 1.85): the Python path still works
  echo "setup: native/ did not build (pip install -v -e . shows why); fingerprints are" \
       "computed in Python (the same values, more CPU a page)" >&2
else
  echo "setup: no cargo on PATH: native/ is not built; fingerprints are computed" \
       "in Python (the same values, more CPU a page)" >&2
fi
