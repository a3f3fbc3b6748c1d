"""Shared by the benchmarks: locating and reading the dev data (never committed)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neardup.config import EngineConfig
    from neardup.engine import Analysed

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def raw_lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as fh:
        return [line for line in fh if line.strip()]


def micro_args(doc: str) -> argparse.Namespace:
    """The options of a micro-benchmark over analysed dev pages: --data, --pages,
    --rounds."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--data", type=Path, default=DATA / "neardup-dev")
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    return ap.parse_args()


def analysed_pages(data: Path, limit: int, cfg: EngineConfig) -> list[Analysed]:
    """The first ``limit`` dev pages analysed in this process; the rejected ones left out."""
    from neardup.contract import parse_raw
    from neardup.engine import Analysed, analyse
    from neardup.records import Rejected

    out = []
    for line in raw_lines(data / "pages.jsonl.gz")[:limit]:
        page = parse_raw(line, cfg.max_bytes)
        if isinstance(page, Rejected):
            continue
        analysed = analyse(page, cfg)
        if isinstance(analysed, Analysed):
            out.append(analysed)
    return out
