"""Replay every input the fuzzers ever broke a stage with: none may break it again.

``tests/regressions/<target>/<kind>-<sha1>`` holds the input byte for byte, as libFuzzer
wrote it (``bench/fuzz.py --save``); ``<target>`` names the function of
``tests/fuzz/targets.py`` that failed on it, and the same invariants are checked here. A
``timeout-`` input once hung its target: it must now finish well inside libFuzzer's limit.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

HERE = Path(__file__).resolve().parent
CASES = sorted(p for p in HERE.glob("*/*") if p.is_file() and p.parent.name in TARGETS)
# libFuzzer's per-input limit in bench/fuzz.py is 10 s; a fixed hang must be far below it.
HANG_LIMIT_S = 5.0


def test_every_regression_directory_names_a_target() -> None:
    dirs = {p.name for p in HERE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert dirs <= set(TARGETS), dirs - set(TARGETS)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name[:20]}" for p in CASES])
def test_replay(case: Path) -> None:
    t0 = time.perf_counter()
    TARGETS[case.parent.name](case.read_bytes())
    if case.name.startswith("timeout-"):
        assert time.perf_counter() - t0 < HANG_LIMIT_S
