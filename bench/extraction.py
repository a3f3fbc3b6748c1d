"""Speed and quality of the extractors in ``neardup.extract``, side by side.

    python bench/extraction.py [--data DIR] [--extractors density,resiliparse,trafilatura]
    python bench/extraction.py --heldout [--seed 39] [--extractors density]

Speed: pages per second of CPU time in this one process (``time.process_time``, so other
load on the machine distorts it less), the median of ``--runs`` passes over all pages, the
extractors interleaved within each pass; "(lexbor parse)" is the parse alone, the ceiling.
Quality: character-bigram precision/recall/F1 of the extracted text against the
references in ``refs.jsonl.gz``, and the share of exact title matches; then F1 by site,
the worst site first, and the worst pages.

``--heldout`` scores instead the pages of the held-out stream (``bench.streams``: site
templates unlike the dev ones, filled with the dev texts at run time), decoded as the
engine decodes them, against the very paragraphs each page was built from (noise-stripped
like the weak references): exact references, by template. Quality only, no timing. The references
are WEAK (other tools' output, see the data README): read the worst pages by eye before
believing a difference. By default ``strip_noise`` is applied to the references too, so
that the editor/source lines they keep do not count as misses; ``--raw-refs`` turns that off.
``--drop-dated-ref-lines`` also drops reference lines ending in a date ("标题2015/07/03"):
the CX references of 44 NetEase pages include the related-articles list that way.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere, without installing

from selectolax.lexbor import LexborHTMLParser  # noqa: E402

from neardup.extract import DEFAULT_EXTRACTOR, strip_noise  # noqa: E402
from neardup.extract import extract as run_extract  # noqa: E402
from neardup.records import Decoded, Extracted, RawPage  # noqa: E402

PARSE_ONLY = "(lexbor parse)"
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([\w-]+)""", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
_DATED = re.compile(r"\d{4}/\d{2}/\d{2}$")


@dataclass(frozen=True, slots=True)
class Ref:
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Score:
    url: str
    precision: float
    recall: float
    f1: float
    title_ok: bool | None  # None when the reference has no title


def _codec(name: str) -> str:
    name = name.lower()
    return "gb18030" if name in ("gbk", "gb2312", "gb18030", "x-gbk") else name


def load_pages(path: Path) -> list[Decoded]:
    """Decode each page with its declared charset; this bench does not test decoding."""
    pages = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            row = json.loads(line)
            ctype = row.get("content_type", "")
            if "html" in row:
                html, charset = row["html"], "utf-8"
            else:
                body = base64.b64decode(row["body_b64"])
                declared = ctype.partition("charset=")[2].strip()
                meta = _CHARSET.search(body[:4096])
                charset = _codec(declared or (meta.group(1).decode() if meta else "utf-8"))
                html = body.decode(charset, errors="replace")
            raw = RawPage(f"p{n}", row["url"], row.get("fetched_at", ""), ctype, html)
            pages.append(Decoded(raw, html, charset, "header"))
    return pages


def load_refs(path: Path) -> dict[str, Ref]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return {r["url"]: Ref(r.get("title") or "", r.get("text") or "") for r in rows}


def bigrams(text: str) -> Counter[str]:
    """Character bigrams within each line, whitespace removed."""
    grams: Counter[str] = Counter()
    for line in text.split("\n"):
        s = _SPACE.sub("", line)
        grams.update(s[i : i + 2] for i in range(len(s) - 1))
    return grams


def prf(got: str, ref: str) -> tuple[float, float, float]:
    g, r = bigrams(got), bigrams(ref)
    overlap = sum((g & r).values())
    n_got, n_ref = sum(g.values()), sum(r.values())
    precision = overlap / n_got if n_got else float(n_ref == 0)
    recall = overlap / n_ref if n_ref else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def time_all(pages: list[Decoded], names: list[str], runs: int) -> dict[str, float]:
    """Median pages/s per extractor, plus "(lexbor parse)": the parse alone, a ceiling."""
    per_run: dict[str, list[float]] = {n: [] for n in [*names, PARSE_ONLY]}
    for _ in range(runs):
        t0 = time.process_time()
        for page in pages:
            LexborHTMLParser(page.html.encode("utf-8", "replace"))
        per_run[PARSE_ONLY].append(len(pages) / (time.process_time() - t0))
        for name in names:
            t0 = time.process_time()
            for page in pages:
                run_extract(page, name)
            per_run[name].append(len(pages) / (time.process_time() - t0))
    return {n: statistics.median(v) for n, v in per_run.items()}


def score_all(
    pages: list[Decoded], refs: dict[str, Ref], name: str, raw_refs: bool, drop_dated: bool
) -> tuple[list[Score], Counter[str]]:
    scores, outcomes = [], Counter[str]()
    for page in pages:
        result = run_extract(page, name)
        outcomes["ok" if isinstance(result, Extracted) else str(result.reason)] += 1
        ref = refs.get(page.page.url)
        if ref is None:
            continue
        got_text = result.text if isinstance(result, Extracted) else ""
        got_title = result.title if isinstance(result, Extracted) else ""
        lines = [_SPACE.sub(" ", x).strip() for x in ref.text.split("\n")]
        lines = [x for x in lines if x and not (drop_dated and _DATED.search(x))]
        ref_text = "\n".join(lines if raw_refs else strip_noise(lines))
        p, r, f = prf(got_text, ref_text)
        title_ok = None
        if ref.title.strip():
            title_ok = _SPACE.sub(" ", got_title).strip() == _SPACE.sub(" ", ref.title).strip()
        scores.append(Score(page.page.url, p, r, f, title_ok))
    return scores, outcomes


def site_of(url: str) -> str:
    """The site a page comes from: the URL's host, or a ``file://`` URL's first part
    (``file://cx-netease/RawHtml/70.html`` is from ``cx-netease``)."""
    split = urlsplit(url)
    return (split.hostname or split.path.strip("/").split("/")[0] or "?").removeprefix("www.")


def by_site(scores: list[Score]) -> dict[str, list[Score]]:
    out: dict[str, list[Score]] = {}
    for s in scores:
        out.setdefault(site_of(s.url), []).append(s)
    return out


def _mean_f1(rows: list[Score]) -> float:
    return statistics.mean(s.f1 for s in rows)


def heldout_pages(seed: int) -> tuple[list[Decoded], dict[str, Ref], dict[str, str]]:
    """The held-out stream's pages, decoded by ``neardup.decode``; each page's own
    paragraphs as its reference; and each page's template by URL."""
    import random  # only this mode needs these

    from bench.common import DATA
    from bench.streams import heldout
    from bench.streams.texts import load_texts
    from neardup.contract import parse_raw
    from neardup.decode import decode

    rng = random.Random(seed)
    # build()'s two steps, kept apart to read each page's paragraphs (the stream's labels
    # do not carry them): _render makes one line per planned page, in order
    builder = heldout._plan(load_texts(DATA / "neardup-dev"), rng)
    stream = heldout._render(builder, rng)
    pages, refs, templates = [], {}, {}
    for line, plan, label in zip(stream.lines, builder.pages, stream.labels, strict=True):
        raw = parse_raw(line, 5 << 20)
        decoded = decode(raw) if isinstance(raw, RawPage) else raw
        if not isinstance(decoded, Decoded):
            continue
        pages.append(decoded)
        refs[label["url"]] = Ref(plan.title, "\n".join(plan.paragraphs))
        templates[label["url"]] = label["template"]
    return pages, refs, templates


def main_heldout(args: argparse.Namespace, names: list[str]) -> int:
    pages, refs, templates = heldout_pages(args.seed)
    print(f"held-out stream (seed {args.seed}): {len(pages)} pages, exact references")
    for n in names:
        scores, outcomes = score_all(pages, refs, n, args.raw_refs, False)
        fs = [s.f1 for s in scores]
        print(
            f"\n{n}: F1 mean {statistics.mean(fs):.3f}, median {statistics.median(fs):.3f}, "
            f"pages under 0.8: {sum(f < 0.8 for f in fs)}; {dict(outcomes)}"
        )
        by_template: dict[str, list[Score]] = {}
        for s in scores:
            by_template.setdefault(templates[s.url], []).append(s)
        print("F1 by template, worst first (pages, mean F1, mean P, mean R, under 0.8):")
        for name, rows in sorted(by_template.items(), key=lambda kv: _mean_f1(kv[1])):
            p, r = (statistics.mean(getattr(s, k) for s in rows) for k in ("precision", "recall"))
            low = sum(s.f1 < 0.8 for s in rows)
            print(f"  {name:<14} {len(rows):5d} {_mean_f1(rows):6.3f} {p:6.3f} {r:6.3f} {low:5d}")
        print(f"{args.worst} worst pages (F1, P, R):")
        for s in sorted(scores, key=lambda s: s.f1)[: args.worst]:
            print(f"  {s.f1:.3f} {s.precision:.3f} {s.recall:.3f}  {templates[s.url]:<12} {s.url}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared/data/extraction-dev")
    ap.add_argument("--extractors", default="density,resiliparse,trafilatura")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--worst", type=int, default=5)
    ap.add_argument("--raw-refs", action="store_true", help="score against unfiltered refs")
    ap.add_argument(
        "--drop-dated-ref-lines", action="store_true", help="drop ref lines ending in a date"
    )
    ap.add_argument("--heldout", action="store_true", help="score the held-out stream")
    ap.add_argument("--seed", type=int, default=39, help="of the held-out stream")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.extractors.split(",") if n.strip()]
    if args.heldout:
        return main_heldout(args, names)

    pages = load_pages(args.data / "pages.jsonl.gz")
    refs = load_refs(args.data / "refs.jsonl.gz")
    kb = statistics.mean(len(p.html) for p in pages) / 1024
    print(f"{len(pages)} pages (mean {kb:.0f} K characters), {len(refs)} weak references")
    refs_kind = "raw" if args.raw_refs else "noise-stripped"
    if args.drop_dated_ref_lines:
        refs_kind += ", dated lines dropped"
    print(f"default extractor: {DEFAULT_EXTRACTOR}; references {refs_kind}")

    speed = time_all(pages, names, args.runs)
    results = {
        n: score_all(pages, refs, n, args.raw_refs, args.drop_dated_ref_lines) for n in names
    }

    head = (
        f"{'extractor':<12} {'pages/s':>8} {'P mean':>7} {'R mean':>7} {'F1 mean':>7} "
        f"{'P med':>6} {'R med':>6} {'F1 med':>6} {'title':>6}  outcomes"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for n in names:
        scores, outcomes = results[n]
        ps, rs, fs = ([getattr(s, k) for s in scores] for k in ("precision", "recall", "f1"))
        titled = [s.title_ok for s in scores if s.title_ok is not None]
        title = sum(titled) / len(titled) if titled else float("nan")
        print(
            f"{n:<12} {speed[n]:8.1f} {statistics.mean(ps):7.3f} {statistics.mean(rs):7.3f} "
            f"{statistics.mean(fs):7.3f} {statistics.median(ps):6.3f} {statistics.median(rs):6.3f} "
            f"{statistics.median(fs):6.3f} {title:6.2f}  {dict(outcomes)}"
        )
    print(f"{PARSE_ONLY:<12} {speed[PARSE_ONLY]:8.1f}  (no extraction: the ceiling)")
    titled_n = sum(1 for s in results[names[0]][0] if s.title_ok is not None)
    print(f"(quality over {len(results[names[0]][0])} referenced pages; title over {titled_n})")

    print("\nspeed ratios (row / column):")
    print(" " * 12 + "".join(f"{n:>13}" for n in names))
    for a in names:
        print(f"{a:<12}" + "".join(f"{speed[a] / speed[b]:13.2f}" for b in names))

    for n in names:
        print(f"\nF1 by site for {n}, worst first (pages, mean F1, mean P, mean R):")
        for site, rows in sorted(by_site(results[n][0]).items(), key=lambda kv: _mean_f1(kv[1])):
            p, r = (statistics.mean(getattr(s, k) for s in rows) for k in ("precision", "recall"))
            print(f"  {site:<28} {len(rows):4d} {_mean_f1(rows):6.3f} {p:6.3f} {r:6.3f}")
    for n in names:
        print(f"\n{args.worst} worst pages for {n} (F1, P, R):")
        for s in sorted(results[n][0], key=lambda s: s.f1)[: args.worst]:
            print(f"  {s.f1:.3f} {s.precision:.3f} {s.recall:.3f}  {s.url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
