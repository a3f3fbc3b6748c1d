"""`neardup report`: the summary it reads from a state, the HTML it writes, and that HTML
rendered by a real headless browser."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from neardup.cli import main
from neardup.config import EngineConfig
from neardup.lookup import Cluster, Page, StateReader
from neardup.report import HostRow, Summary, host_of, summarise
from neardup.report_html import COLOURS, cluster_block, link, render, size_chart
from neardup.store import open_state, open_to_read
from tests.unit.test_query import FIRST_RUN, HOSTILE_URL, SECOND_RUN, Built, build_state

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    path = str(tmp_path_factory.mktemp("state") / "state")
    return build_state(path, [FIRST_RUN, SECOND_RUN])


def _summary(built: Built, **kw: int) -> Summary:
    kv = open_to_read(built.path)
    try:
        return summarise(StateReader(kv), **kw)
    finally:
        kv.close()


def _empty(sizes: dict[int, int]) -> Summary:
    return Summary("s", 0, Counter(), [], HostRow("none"), 0, Counter(sizes), [], Counter())


# --- what it summarises -------------------------------------------------------------------


def test_the_summary_counts_what_the_decisions_say(built: Built) -> None:
    s = _summary(built)
    decisions = built.decisions.values()
    assert s.pages == len(built.decisions)
    assert s.kinds == Counter(d["decision"] for d in decisions)
    hosts = Counter(host_of(d["url"]) for d in decisions)
    assert {r.host: r.pages for r in s.hosts} == hosts
    assert s.host_count == len(hosts) and s.other_hosts.pages == 0
    per_host = Counter((host_of(d["url"]), d["decision"]) for d in decisions)
    assert {(r.host, k): n for r in s.hosts for k, n in r.kinds.items()} == +per_host
    cluster_sizes = Counter(Counter(built.cluster_of.values()).values())
    assert s.sizes == cluster_sizes
    assert [c.size for c in s.largest][:2] == [3, 2]
    assert s.engines.total() == s.pages


def test_hosts_past_the_limit_are_summed(built: Built) -> None:
    s = _summary(built, hosts=2)
    assert len(s.hosts) == 2
    assert s.hosts[0].host == "a.example.cn"  # the most pages
    assert s.hosts[0].pages + s.hosts[1].pages + s.other_hosts.pages == s.pages
    assert s.other_hosts.host == f"{s.host_count - 2} other hosts"


def test_cluster_sizes_are_binned_up_to_the_last_bin_with_any() -> None:
    rows = _empty({1: 5, 2: 3, 7: 1, 150: 2}).binned_sizes()
    assert [r[0] for r in rows][-1] == "101+"
    assert dict((label, (n, pages)) for label, n, pages in rows) == {
        "1": (5, 5), "2": (3, 6), "3": (0, 0), "4": (0, 0), "5": (0, 0), "6–10": (1, 7),
        "11–20": (0, 0), "21–50": (0, 0), "51–100": (0, 0), "101+": (2, 300),
    }  # fmt: skip
    assert [r[0] for r in _empty({1: 2, 3: 1}).binned_sizes()] == ["1", "2", "3"]


def test_host_of_hostile_urls() -> None:
    assert host_of("https://WWW.Example.cn:8080/x") == "example.cn"
    assert host_of("http://[::1/") == "(no host)"
    assert host_of("javascript:alert(1)") == "(no host)"


# --- the HTML -------------------------------------------------------------------------------

EVIL = '<img src=x onerror="alert(1)">\u202e\x07"&'


def _evil_cluster() -> Cluster:
    decision = {"decision": "duplicate", "title": EVIL}
    pages = (
        Page(1, "p1", "javascript:alert(1)", 0, decision),
        Page(2, 'p2"><b>', "https://x.example.cn/?a=\"'><script>x()</script>", 1, decision),
    )
    return Cluster('c"<i>', pages)


def test_page_supplied_strings_are_escaped_and_only_http_becomes_a_link() -> None:
    out = cluster_block(1, _evil_cluster(), 10)
    assert "<img" not in out and "<script" not in out and "<b>" not in out and "<i>" not in out
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;\ufffd\ufffd&quot;&amp;" in out
    assert "href" not in link("javascript:alert(1)")
    assert link("JavaScript:alert(1)") == "JavaScript:alert(1)"
    assert link('https://a.cn/"x') == (
        '<a href="https://a.cn/&quot;x" rel="noopener noreferrer nofollow">https://a.cn/&quot;x</a>'
    )


def test_the_report_is_one_self_contained_file(built: Built) -> None:
    page = render(_summary(built))
    assert page.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in page  # no script runs, nothing is fetched
    for fetching in ("<script", "<link", "src=", "@import", "url("):
        assert fetching not in page.lower()
    assert HOSTILE_URL not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "<svg" in page and page.count("<section") == 4
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \ufffd[31m红色&quot;&amp;" in page


def test_the_report_command(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--state", built.path, "--out", str(out), "-q"]) == 0
    assert out.read_text(encoding="utf-8").endswith("</html>\n")
    assert os.listdir(tmp_path) == ["r.html"]  # no temporary file left
    assert main(["report", "--state", built.path, "--out", str(tmp_path / "no/r.html")]) == 1


def test_a_state_with_no_page_yet_gets_a_report(tmp_path: Path) -> None:
    open_state(str(tmp_path / "state"), EngineConfig()).close()  # the marker alone
    out = tmp_path / "r.html"
    assert main(["report", "--state", str(tmp_path / "state"), "--out", str(out), "-q"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "No page matched another" in text and "<svg" in text


# --- in a real browser ------------------------------------------------------------------------


def _unfilter(f: int, row: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    """One PNG scanline with its filter undone (PNG spec, section 9.2)."""
    if f == 0:
        return row
    if f == 1:  # Sub: a running sum along each channel
        return (row.reshape(-1, bpp).cumsum(axis=0, dtype=np.uint32) & 255).astype(np.uint8).ravel()
    if f == 2:  # Up
        return row + prev  # uint8 wraps, as the spec's "mod 256"
    out, up = bytearray(row.tobytes()), prev.tobytes()  # Average, Paeth: byte by byte
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3:
            out[i] = (out[i] + (a + b) // 2) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.frombuffer(bytes(out), np.uint8)


def _colours(png: bytes) -> Counter[tuple[int, int, int]]:
    """How many pixels of each RGB colour an 8-bit, non-interlaced RGB(A) PNG holds."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", b""
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + n]
        head = body if kind == b"IHDR" else head
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 4 if colour == 6 else 3
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * bpp + 1)
    prev = np.zeros(w * bpp, np.uint8)
    rows = []
    for line in raw:
        prev = _unfilter(int(line[0]), line[1:], prev, bpp)
        rows.append(prev)
    rgb = np.stack(rows).reshape(h * w, bpp)[:, :3].astype(np.uint32)
    packed = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    values, counts = np.unique(packed, return_counts=True)
    return Counter(
        {
            (int(v) >> 16, (int(v) >> 8) & 255, int(v) & 255): int(n)
            for v, n in zip(values, counts, strict=True)
        }
    )


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return (int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16))


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    if CHROMIUM is None:
        reason = "no chromium binary (apt-get install chromium) for the browser test"
        if IN_CI:
            pytest.fail(f"{reason}; CI must run it")
        pytest.skip(reason)
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_the_chart_renders_its_bars_in_a_browser(tmp_path: Path) -> None:
    page = tmp_path / "chart.html"
    bins = [("1", 400, 400), ("2", 200, 400), ("3", 100, 300)]
    page.write_text(f"<!DOCTYPE html><body style='margin:0'>{size_chart(bins)}", "utf-8")
    shot = tmp_path / "chart.png"
    _chromium(tmp_path, "--window-size=620,260", f"--screenshot={shot}", page.as_uri())
    colours = _colours(shot.read_bytes())
    grey, red = colours[_rgb(COLOURS["unique"])], colours[_rgb(COLOURS["duplicate"])]
    # bars of 400 against 200 + 100 clusters: their areas say so, within antialiasing
    assert grey > 5000 and red > 5000
    assert 0.6 < red / grey < 0.9


def test_the_report_renders_in_a_browser_and_nothing_in_it_runs(
    built: Built,
    tmp_path: Path,
) -> None:
    page = tmp_path / "report.html"
    page.write_text(render(_summary(built)), "utf-8")
    shot = tmp_path / "report.png"
    _chromium(tmp_path, "--window-size=1366,900", f"--screenshot={shot}", page.as_uri())
    colours = _colours(shot.read_bytes())
    total = colours.total()
    background = colours.most_common(1)[0][1]
    assert background < 0.9 * total  # not blank: cards, tables, bars and text
    assert len(colours) > 200  # text is antialiased in many shades
    for kind in ("unique", "duplicate"):
        assert colours[_rgb(COLOURS[kind])] > 1000, kind  # the decisions bar
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode("utf-8")
    assert not re.search(r"<(script|img)\b", dom)  # hostile titles and URLs stayed text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in dom
