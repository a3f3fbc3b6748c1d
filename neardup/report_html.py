"""The HTML of ``neardup report``: one file with its CSS and an SVG chart inline, no script
and nothing fetched (its Content-Security-Policy forbids both). Titles, URLs and hosts
come from crawled pages and are hostile: every one is escaped, and only http(s) URLs
become links."""

from __future__ import annotations

import datetime as dt
import html
import math
import unicodedata
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from neardup import __version__
from neardup.lookup import Cluster
from neardup.report import KINDS, HostRow, Summary, host_of

COLOURS = {
    "unique": "#8da0b6",
    "duplicate": "#d9534f",
    "contained": "#8e6cc1",
    "contains": "#3c9d6b",
}
_CONTROL = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1f2328; line-height: 1.45;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans CJK SC",
  "PingFang SC", "Microsoft YaHei", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 12px; }
h3 { font-size: 15px; margin: 0 0 8px; overflow-wrap: anywhere; }
section { background: #fff; border: 1px solid #d8dee4; border-radius: 8px;
  padding: 18px 20px; margin: 18px 0; }
.meta { color: #59636e; font-size: 13px; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 16px; }
.card { flex: 1 1 150px; background: #fff; border: 1px solid #d8dee4; border-radius: 8px;
  padding: 10px 14px; }
.card b { display: block; font-size: 22px; }
.card span { color: #59636e; font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; }
table.narrow { width: auto; min-width: 300px; }
.split { display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; }
.split .chart { flex: 1 1 520px; max-width: 700px; }
td.when { white-space: nowrap; font-variant-numeric: tabular-nums; }
details { margin-top: 4px; }
details p { margin: 4px 0; font-family: ui-monospace, monospace; font-size: 12px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #eaeef2;
  vertical-align: top; }
th { color: #59636e; font-weight: 600; background: #f6f8fa; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.url { overflow-wrap: anywhere; font-size: 12.5px; color: #59636e; max-width: 380px; }
td.title { overflow-wrap: anywhere; }
.bar { display: flex; height: 14px; min-width: 120px; border-radius: 3px; overflow: hidden;
  background: #eaeef2; }
.bar.big { height: 26px; margin-bottom: 10px; }
.bar span { display: block; height: 100%; }
.key { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 6px; vertical-align: baseline; }
.chip { display: inline-block; padding: 0 6px; border-radius: 10px; font-size: 12px;
  color: #fff; white-space: nowrap; }
.more { color: #59636e; font-size: 13px; margin: 6px 0 0; }
svg text { font: 12px system-ui, sans-serif; fill: #1f2328; }
svg .axis { font-size: 11px; fill: #59636e; }
a { color: #0b63c5; text-decoration: none; }
a:hover { text-decoration: underline; }
"""


def esc(text: object) -> str:
    """Page-supplied text as HTML text or attribute value: escaped, with control and
    format characters (which a browser may act on or drop) shown as U+FFFD."""
    clean = "".join("\ufffd" if unicodedata.category(c) in _CONTROL else c for c in str(text))
    return html.escape(clean, quote=True)


def link(url: str) -> str:
    """``url`` as a link if it is http(s), else as text: a ``javascript:`` or ``data:``
    URL from a page must not become something to click."""
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme not in ("http", "https"):
        return esc(url)
    return f'<a href="{esc(url)}" rel="noopener noreferrer nofollow">{esc(url)}</a>'


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"


def kind_bar(kinds: Mapping[str, int], big: bool = False) -> str:
    total = sum(kinds.values())
    spans = "".join(
        f'<span style="width:{100 * kinds.get(k, 0) / total:.3f}%;background:{COLOURS[k]}" '
        f'title="{k}: {kinds.get(k, 0)}"></span>'
        for k in KINDS
        if total and kinds.get(k, 0)
    )
    return f'<div class="bar{" big" if big else ""}">{spans}</div>'


def chip(kind: str) -> str:
    colour = COLOURS.get(kind, "#59636e")
    return f'<span class="chip" style="background:{colour}">{esc(kind)}</span>'


def kinds_section(s: Summary) -> str:
    rows = "".join(
        f'<tr><td><span class="key" style="background:{COLOURS[k]}"></span>{k}</td>'
        f'<td class="n">{s.kinds.get(k, 0):,}</td><td class="n">{_pct(s.kinds.get(k, 0), s.pages)}'
        "</td></tr>"
        for k in KINDS
    )
    return (
        '<section id="kinds"><h2>Decisions by kind</h2>'
        f"{kind_bar(s.kinds, big=True)}"
        '<table class="narrow"><thead><tr><th>decision</th><th class="n">pages</th>'
        '<th class="n">share</th>'
        f"</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _host_row(row: HostRow, name: str) -> str:
    cells = "".join(f'<td class="n">{row.kinds.get(k, 0):,}</td>' for k in KINDS)
    copies = row.pages - row.kinds.get("unique", 0)
    return (
        f'<tr><td class="title">{name}</td><td class="n">{row.pages:,}</td>{cells}'
        f'<td class="n">{_pct(copies, row.pages)}</td><td>{kind_bar(row.kinds)}</td></tr>'
    )


def hosts_section(s: Summary) -> str:
    rows = "".join(_host_row(r, esc(r.host)) for r in s.hosts)
    if s.other_hosts.pages:
        rows += _host_row(s.other_hosts, f"<i>{esc(s.other_hosts.host)}</i>")
    heads = "".join(f'<th class="n">{k}</th>' for k in KINDS)
    return (
        f'<section id="hosts"><h2>Decisions by host</h2><p class="meta">{s.host_count:,} '
        f"hosts; the {len(s.hosts)} with most pages. <i>not unique</i>: the share of a "
        "host's pages that matched an earlier page.</p>"
        f'<table><thead><tr><th>host</th><th class="n">pages</th>{heads}'
        '<th class="n">not unique</th><th>decisions</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></section>"
    )


def _ticks(top: int) -> list[int]:
    """About four round gridline values from 0 to at least ``top``."""
    if top <= 0:
        return [0, 1]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step = max(int(step), 1)
    return list(range(0, top + step, step))


def size_chart(bins: Iterable[tuple[str, int, int]]) -> str:
    """A bar chart, as inline SVG, of the number of clusters of each size bin."""
    rows = list(bins)
    width, height, left, bottom, top_pad = 620, 260, 56, 44, 24
    ticks = _ticks(max((n for _, n, _ in rows), default=0))
    ymax = ticks[-1]
    plot_w, plot_h = width - left - 12, height - bottom - top_pad
    slot = plot_w / max(len(rows), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="clusters by size">'
    ]
    for t in ticks:
        y = top_pad + plot_h - plot_h * t / ymax
        parts.append(
            f'<line x1="{left}" x2="{width - 12}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#eaeef2"/><text class="axis" x="{left - 8}" y="{y + 4:.1f}" '
            f'text-anchor="end">{t:,}</text>'
        )
    for i, (label, n, pages) in enumerate(rows):
        bar_h = plot_h * n / ymax
        x = left + i * slot + slot * 0.15
        y = top_pad + plot_h - bar_h
        colour = COLOURS["unique"] if label == "1" else COLOURS["duplicate"]
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{bar_h:.1f}" '
            f'fill="{colour}" rx="2"><title>{n:,} clusters of {esc(label)} pages '
            f"({pages:,} pages)</title></rect>"
            f'<text x="{x + slot * 0.35:.1f}" y="{y - 5:.1f}" text-anchor="middle">{n:,}</text>'
            f'<text class="axis" x="{x + slot * 0.35:.1f}" y="{top_pad + plot_h + 18:.1f}" '
            f'text-anchor="middle">{esc(label)}</text>'
        )
    parts.append(
        f'<text class="axis" x="{left + plot_w / 2:.1f}" y="{height - 6}" '
        'text-anchor="middle">pages in the cluster</text>'
        f'<text class="axis" transform="translate(14 {top_pad + plot_h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle">clusters</text></svg>'
    )
    return "".join(parts)


def sizes_section(s: Summary) -> str:
    bins = s.binned_sizes()
    rows = "".join(
        f'<tr><td>{esc(label)}</td><td class="n">{n:,}</td><td class="n">{pages:,}</td></tr>'
        for label, n, pages in bins
    )
    return (
        '<section id="sizes"><h2>Cluster sizes</h2><p class="meta">A cluster of 1 is a page '
        "that matched no other page.</p>"
        f'<div class="split"><div class="chart">{size_chart(bins)}</div>'
        '<table class="narrow"><thead><tr><th>pages in the cluster</th>'
        '<th class="n">clusters</th>'
        f'<th class="n">pages</th></tr></thead><tbody>{rows}</tbody></table></div></section>'
    )


def _when(fetched_at: str) -> str:
    """An RFC 3339 time to the minute, as a table shows it."""
    return fetched_at[:16].replace("T", " ")


def cluster_block(rank: int, c: Cluster, members: int) -> str:
    head = c.members[0] if c.members else None
    title = esc(head.title) if head and head.title else "<i>(no title)</i>"
    rows = "".join(
        f'<tr><td>{chip(m.kind)}</td><td class="when">{esc(_when(m.fetched_at))}</td>'
        f"<td>{esc(host_of(m.url))}</td>"
        f'<td class="title">{esc(m.title)}</td><td class="url">{link(m.url)}</td></tr>'
        for m in c.members[:members]
    )
    more = (
        f'<p class="more">… and {c.size - members:,} more: <code>neardup query --state DIR '
        f"{esc(c.cluster_id)}</code> lists them all.</p>"
        if c.size > members
        else ""
    )
    return (
        f'<div class="cluster"><h3>#{rank} · {c.size:,} pages · {title}</h3>'
        f'<p class="meta">cluster {esc(c.cluster_id)}</p>'
        "<table><thead><tr><th>decision</th><th>fetched</th><th>host</th><th>title</th>"
        f"<th>URL</th></tr></thead><tbody>{rows}</tbody></table>{more}</div>"
    )


def largest_section(s: Summary, members: int) -> str:
    shown = [c for c in s.largest if c.size > 1]
    if not shown:
        body = '<p class="meta">No page matched another: every cluster has one page.</p>'
    else:
        body = '<hr style="border:0;border-top:1px solid #eaeef2;margin:16px 0">'.join(
            cluster_block(i, c, members) for i, c in enumerate(shown, 1)
        )
    return f'<section id="largest"><h2>Largest clusters</h2>{body}</section>'


def render(s: Summary, members: int = 12) -> str:
    """The whole report as one HTML document."""
    in_clusters = sum(size * n for size, n in s.sizes.items() if size > 1)
    multi = sum(n for size, n in s.sizes.items() if size > 1)
    cards = [
        (f"{s.pages:,}", "pages decided"),
        (f"{s.pages - s.kinds.get('unique', 0):,}", "matched an earlier page"),
        (f"{multi:,}", "clusters of 2 or more pages"),
        (f"{in_clusters:,}", "pages in those clusters"),
        (f"{s.host_count:,}", "hosts"),
    ]
    card_html = "".join(f'<div class="card"><b>{v}</b><span>{t}</span></div>' for v, t in cards)
    engines = "".join(f"<p>{esc(e)} ({n:,} pages)</p>" for e, n in s.engines.most_common(5))
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return (
        '<!DOCTYPE html><html lang="zh-CN"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>neardup report: {esc(s.state)}</title><style>{CSS}</style></head><body><main>"
        f'<h1>Near-duplicate report</h1><p class="meta">state {esc(s.state)} · written '
        f"{now} by neardup {esc(__version__)}</p><details class='meta'><summary>engine "
        f"versions and parameters that decided the pages</summary>{engines}</details>"
        f'<div class="cards">{card_html}</div>'
        f"{kinds_section(s)}{sizes_section(s)}{largest_section(s, members)}{hosts_section(s)}"
        "</main></body></html>\n"
    )
