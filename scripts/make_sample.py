"""Write examples/sample.jsonl: a small licence-clean stream built from tests/corpus.py.

It shows every decision kind and two rejections. Rerun after changing the corpus:
    .venv/bin/python scripts/make_sample.py
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import opencc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.corpus import ARTICLES, HARD_A, HARD_B, line, raw_page


def main() -> None:
    s2t = opencc.OpenCC("s2t")
    rail, harvest, museum, library = (ARTICLES[k] for k in ("rail", "harvest", "museum", "library"))
    edited = [p.replace("两年", "三年").replace("九百", "八百") for p in library]
    pages = [
        raw_page("https://news.example.cn/city/rail.html", rail, "地铁三号线今日开通"),
        raw_page("https://blog.example.com/p/1001", library, "老图书馆重新开放", template="blog"),
        raw_page(
            "https://news.example.cn/city/harvest-brief.html",
            harvest[:3],
            "夏粮收购全面启动（摘要）",
        ),
        raw_page("https://www.example.org/museum.html", museum, "航海博物馆落成", charset="gbk"),
        raw_page(
            "https://blog.example.com/p/1002",
            ["【转载】本文来源：城市新闻网", *rail],
            "【转载】地铁三号线开通",
            template="blog",
        ),
        raw_page(
            "https://hk.example.net/rail-trad.html",
            [s2t.convert(p) for p in rail],
            s2t.convert("地铁三号线今日开通"),
            template="blog",
            charset="big5",
        ),
        raw_page("https://news.example.cn/city/harvest.html", harvest, "夏粮收购全面启动"),
        raw_page("https://news.example.cn/gov/flood.html", HARD_A, "市政府部署防汛工作"),
        raw_page("https://news.example.cn/gov/heating.html", HARD_B, "市政府部署供暖工作"),
        raw_page("https://blog.example.com/p/1003", edited, "老图书馆重新开放", template="blog"),
        raw_page(
            "https://news.example.cn/tech/drones.html", ARTICLES["startup"], "农业无人机企业获融资"
        ),
        raw_page(
            "https://blog.example.com/p/1004",
            [museum[i] for i in (1, 0, 2, 4, 3)],
            "航海博物馆开馆",
            template="blog",
        ),
        raw_page("https://news.example.cn/weather/heat.html", ARTICLES["heatwave"], "高温橙色预警"),
    ]
    for i, page in enumerate(pages):
        page["fetched_at"] = f"2026-03-01T08:{i:02d}:00Z"
    lines = [line(p) for p in pages]
    lines.insert(7, '{"url": "https://broken.example.cn/x", "fetched_at": "2026-03-01T08:')
    pdf = {
        "url": "https://files.example.cn/report.pdf",
        "fetched_at": "2026-03-01T08:30:00Z",
        "content_type": "application/pdf",
        "body_b64": base64.b64encode(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj").decode(),
    }
    lines.append(json.dumps(pdf))
    out = Path(__file__).resolve().parent.parent / "examples" / "sample.jsonl"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines to {out}")


if __name__ == "__main__":
    main()
