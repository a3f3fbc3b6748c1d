"""Charset decoding on the dev pages: which layer wins, how much U+FFFD, how long it takes.

    python bench/decode.py [--data DIR]

DIR defaults to ../shared/data beside the repository. Besides the pages as they come, it
replays the byte pages with their labels taken away or falsified, to see that the later
layers find the charset the label would have given. Prints figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from neardup.charset import codec_for, header_charset  # noqa: E402
from neardup.contract import parse_raw  # noqa: E402
from neardup.decode import LAYERS, decode  # noqa: E402
from neardup.records import Decoded, RawPage, Rejected  # noqa: E402

DATASETS = ("neardup-dev/pages.jsonl.gz", "extraction-dev/pages.jsonl.gz")
MAX_BYTES = 8 * 1024 * 1024
_META = re.compile(rb"(<meta[^>]{0,512}?charset\s*=\s*[\"']?\s*)([\w.:\-]{1,40})", re.I)


def pages(path: Path) -> Iterator[RawPage]:
    with gzip.open(path, "rb") as fh:
        for line in fh:
            page = parse_raw(line, MAX_BYTES)
            if isinstance(page, Rejected):
                print(f"  {path.name}: rejected by parse_raw: {page.detail}")
                continue
            yield page


def timed(page: RawPage) -> tuple[Decoded | Rejected, float]:
    start = time.perf_counter()
    result = decode(page)
    return result, time.perf_counter() - start


def report(title: str, items: list[RawPage]) -> None:
    layers: collections.Counter[str] = collections.Counter()
    charsets: collections.Counter[tuple[str, str]] = collections.Counter()
    times: dict[str, list[float]] = collections.defaultdict(list)
    per_150k: list[float] = []
    chars = replaced = 0
    odd: list[str] = []
    for page in items:
        result, seconds = timed(page)
        if isinstance(result, Rejected):
            layers[f"rejected:{result.reason}"] += 1
            odd.append(f"{page.url}: {result.reason} {result.detail}")
            continue
        layers[result.layer] += 1
        label = page.content_type.partition("charset=")[2] or "-"
        charsets[(label, result.charset)] += 1
        times[result.layer].append(seconds)
        if isinstance(page.body, bytes) and len(page.body) > 10_000:
            per_150k.append(seconds * 150_000 / len(page.body))
        chars += len(result.html)
        replaced += result.html.count("\ufffd")
        if result.layer in ("utf8", "detector", "replace") and isinstance(page.body, bytes):
            odd.append(f"{page.url}: label {label!r}, decided {result.charset} by {result.layer}")
    print(f"\n== {title}: {len(items)} pages")
    print("  layer counts: " + ", ".join(f"{k}={layers[k]}" for k in LAYERS if layers[k]))
    rejected = {k: v for k, v in layers.items() if k.startswith("rejected")}
    if rejected:
        print(f"  rejected: {rejected}")
    print("  label -> charset: " + ", ".join(f"{a}->{b}: {n}" for (a, b), n in charsets.items()))
    print(f"  U+FFFD: {replaced} of {chars} characters ({replaced / max(chars, 1):.6%})")
    for layer, values in times.items():
        ms = sorted(v * 1000 for v in values)
        print(
            f"  decode time [{layer}] median {statistics.median(ms):.3f} ms,"
            f" p95 {ms[int(0.95 * (len(ms) - 1))]:.3f} ms, max {ms[-1]:.3f} ms"
        )
    if per_150k:
        scaled = statistics.median(per_150k) * 1000
        print(f"  byte pages, median time scaled to 150 KB: {scaled:.3f} ms")
    for line in odd[:10]:
        print(f"  note: {line}")
    if len(odd) > 10:
        print(f"  ... and {len(odd) - 10} more notes")


def accuracy(title: str, items: list[RawPage], change: Callable[[RawPage], RawPage]) -> None:
    """Decode changed copies of byte pages; compare with decoding by the original label."""
    layers: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []
    times: list[float] = []
    for page in items:
        truth_codec = header_charset(page.content_type)
        if not isinstance(page.body, bytes) or truth_codec is None:
            continue
        truth = _by_label(page.body, truth_codec)
        result, seconds = timed(change(page))
        times.append(seconds * 1000)
        if isinstance(result, Rejected):
            layers["rejected"] += 1
            wrong.append(f"{page.url}: {result.reason} {result.detail}")
            continue
        layers[result.layer] += 1
        if result.html.lstrip("\ufeff") != truth and not _same_but_meta(result.html, truth):
            wrong.append(f"{page.url}: {truth_codec} decoded as {result.charset} ({result.layer})")
    total = sum(layers.values())
    print(f"\n== {title}: {total} byte pages, {total - len(wrong)} decoded as the label says")
    print("  layer counts: " + ", ".join(f"{k}={v}" for k, v in sorted(layers.items())))
    if times:
        print(f"  decode time median {statistics.median(times):.3f} ms, max {max(times):.3f} ms")
    for line in wrong[:10]:
        print(f"  wrong: {line}")


def _by_label(body: bytes, codec: str) -> str:
    # Some Big5 pages hold ETEN kana that only cp950 has (see neardup.decode).
    for candidate in (codec, "cp950") if codec == "big5hkscs" else (codec,):
        try:
            return body.decode(candidate)
        except UnicodeDecodeError:
            pass
    return body.decode(codec, "replace")


def _same_but_meta(text: str, truth: str) -> bool:
    # Blanking the meta label changes a few ASCII characters; compare without them.
    return len(text) == len(truth) and sum(a != b for a, b in zip(text, truth, strict=True)) < 40


def no_header(page: RawPage) -> RawPage:
    return replace(page, content_type="text/html")


def no_labels(page: RawPage) -> RawPage:
    assert isinstance(page.body, bytes)
    body = _META.sub(lambda m: m.group(1) + b"x" * len(m.group(2)), page.body, count=1)
    return replace(page, content_type="text/html", body=body)


def swapped(page: RawPage) -> RawPage:
    """Big5 labelled gb2312, GB labelled utf-8: the classic mislabels, meta removed."""
    bare = no_labels(page)
    is_gb = codec_for(page.content_type.partition("charset=")[2]) == "gb18030"
    wrong = "utf-8" if is_gb else "gb2312"
    return replace(bare, content_type=f"text/html; charset={wrong}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    args = parser.parse_args()
    for name in DATASETS:
        path = args.data / name
        if not path.exists():
            print(f"missing {path}; skipped")
            continue
        items = list(pages(path))
        report(name, items)
        byte_pages = [p for p in items if isinstance(p.body, bytes)]
        accuracy(f"{name}, Content-Type charset removed", byte_pages, no_header)
        accuracy(f"{name}, header and meta charset removed", byte_pages, no_labels)
        accuracy(f"{name}, mislabelled (Big5 as gb2312, GB as utf-8)", byte_pages, swapped)


if __name__ == "__main__":
    main()
