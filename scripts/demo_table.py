"""The demo's table: one row per decision, then one per rejected page, from the files that
`neardup dedup` wrote into a directory (decisions.jsonl, rejects.jsonl)."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

URL_WIDTH = 40


def short_url(url: str, width: int = URL_WIDTH) -> str:
    """``url`` in at most ``width`` characters: without its scheme, and if still too long,
    cut in the middle so that its host and its end (the page's own name) both stay."""
    text = url.split("://", 1)[-1]
    if len(text) <= width:
        return text
    host = text.partition("/")[0]
    keep_host = min(len(host) + 1, width // 2)  # the host and its slash
    tail = width - keep_host - 1
    return f"{text[:keep_host]}…{text[-tail:]}" if tail > 0 else text[: width - 1] + "…"


def fit(text: str, width: int) -> str:
    """``text`` cut and padded to ``width`` columns (a Chinese character takes two)."""
    out, used = [], 0
    for ch in text:
        w = 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out) + " " * (width - used)


def shown(value: object) -> str:
    return "-" if value is None else str(value)


def rows(out: Path) -> list[str]:
    lines = [
        f"{'page':<{URL_WIDTH}} {'decision':<10} {'duplicate_of':<18} {'cluster':<18} "
        "dist  sim    title"
    ]
    for raw in (out / "decisions.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(raw)
        lines.append(
            f"{short_url(d['url']):<{URL_WIDTH}} {d['decision']:<10} "
            f"{shown(d['duplicate_of']):<18} {d['cluster_id']:<18} {shown(d['distance']):<5} "
            f"{shown(d['similarity']):<6} {fit(d['title'], 24).rstrip()}"
        )
    rejects = out / "rejects.jsonl"
    for raw in rejects.read_text(encoding="utf-8").splitlines() if rejects.exists() else []:
        r = json.loads(raw)
        url = short_url(str(r["url"])) if r["url"] else "(no url)"
        lines.append(f"{url:<{URL_WIDTH}} REJECTED   {r['reason']}: {r['detail'][:60]}")
    return lines


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]))))
