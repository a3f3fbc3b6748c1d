"""Shared by the benchmarks: locating and reading the dev data (never committed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def raw_lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as fh:
        return [line for line in fh if line.strip()]
