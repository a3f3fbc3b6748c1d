"""What the command line tells while and after it runs, resuming from --state, and the
usage errors caught before any output is opened."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from neardup.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, main
from neardup.progress import Bar
from neardup.reading import Reading
from neardup.sources import iter_pages
from tests.corpus import line, raw_page

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample.jsonl"
NO_SANDBOX = ["--set", "extract_timeout_s=0"]  # analysis in this process, to be counted


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def story(i: int) -> list[str]:
    """A page's paragraphs, different for each ``i``."""
    return [
        f"第{i}号通告：本市第{i}批老旧小区改造工程今日开工，涉及居民{100 + i}户。",
        f"施工期间第{i}片区的道路将分段封闭，请居民提前安排出行。",
    ]


def write_pages(path: Path, ids: list[str]) -> None:
    rows = []
    for page_id in ids:
        i = int(page_id.removeprefix("p"))
        page = raw_page(f"https://city{i}.example.cn/notice/{i}.html", story(i), f"通告{i}")
        rows.append(line({**page, "page_id": page_id}) + "\n")
    path.write_text("".join(rows), encoding="utf-8")


def stats_of(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


class Counted:
    """Counts the calls to a function it wraps."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kw)


def test_a_resumed_run_skips_decided_pages_before_reading_their_bodies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from neardup import engine
    from neardup.sources import jsonl

    pages, state = tmp_path / "pages.jsonl", tmp_path / "state"
    write_pages(pages, ["p1", "p2", "p3"])
    first, again = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    argv = ["dedup", str(pages), "--state", str(state), *NO_SANDBOX]
    assert main([*argv, "--out", str(first), "-q"]) == EXIT_OK
    analysed = Counted(engine.analyse)
    parsed = Counted(jsonl.parse_loaded)
    monkeypatch.setattr(engine, "analyse", analysed)
    monkeypatch.setattr(jsonl, "parse_loaded", parsed)
    code = main([*argv, "--out", str(again), "--stats", str(tmp_path / "s.json")])
    assert code == EXIT_OK
    assert (analysed.calls, parsed.calls) == (0, 0)
    assert read(again) == []
    stats = stats_of(tmp_path / "s.json")
    assert (stats["pages"], stats["skipped"], stats["decided"]) == (3, 3, 0)
    err = capsys.readouterr().err
    assert "3 pages in " in err and "0 decided, 3 skipped" in err
    assert "skipped: 3 pages that an earlier run with this --state decided" in err


def test_a_resumed_run_decides_the_new_pages_and_repeats_in_run_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    write_pages(old, ["p1", "p2"])
    write_pages(new, ["p1", "p3", "p3"])  # p1 decided by the earlier run; p3 comes twice
    main(["dedup", str(old), "--out", str(tmp_path / "1.jsonl"), "--state", str(state), "-q"])
    out, clusters, stats = tmp_path / "2.jsonl", tmp_path / "c.jsonl", tmp_path / "s.json"
    argv = ["dedup", str(new), "--out", str(out), "--state", str(state)]
    assert main([*argv, "--clusters", str(clusters), "--stats", str(stats)]) == EXIT_OK
    decisions = read(out)
    # p3's second coming is answered with its first decision, as within any run
    assert [d["page_id"] for d in decisions] == ["p3", "p3"]
    assert decisions[0] == decisions[1]
    s = stats_of(stats)
    assert (s["pages"], s["decided"], s["skipped"], s["repeated"]) == (3, 1, 1, 1)
    # --clusters names every page of this run's input, the skipped one too
    assert {c["page_id"] for c in read(clusters)} == {"p1", "p3"}
    assert "3 pages in " in capsys.readouterr().err


def test_without_state_nothing_is_skipped(tmp_path: Path) -> None:
    pages = tmp_path / "pages.jsonl"
    write_pages(pages, ["p1", "p1"])
    out, stats = tmp_path / "d.jsonl", tmp_path / "s.json"
    assert main(["dedup", str(pages), "--out", str(out), "--stats", str(stats), "-q"]) == 0
    assert len(read(out)) == 2
    assert (stats_of(stats)["skipped"], stats_of(stats)["repeated"]) == (0, 1)


def test_pages_decided_before_are_skipped_from_warc_too(tmp_path: Path) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    warc, url = tmp_path / "pages.warc", "https://w.example.cn/a.html"
    html = raw_page(url, story(7), "通告7")["html"].encode("utf-8")
    headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
    with warc.open("wb") as fh:
        writer = WARCWriter(fh, gzip=False)
        record = writer.create_warc_record(
            url, "response", payload=io.BytesIO(html), http_headers=headers
        )
        writer.write_record(record)
    state = tmp_path / "state"
    argv = ["dedup", str(warc), "--state", str(state), "-q"]
    assert main([*argv, "--out", str(tmp_path / "1.jsonl")]) == EXIT_OK
    assert len(read(tmp_path / "1.jsonl")) == 1
    assert main([*argv, "--out", str(tmp_path / "2.jsonl"), "--stats", str(tmp_path / "s")]) == 0
    assert read(tmp_path / "2.jsonl") == []
    assert stats_of(tmp_path / "s")["skipped"] == 1


def test_the_summary_is_in_words_and_the_same_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, rj, stats = tmp_path / "d.jsonl", tmp_path / "r.jsonl", tmp_path / "s.json"
    argv = ["dedup", str(SAMPLE), "--out", str(out), "--rejects", str(rj), "--stats", str(stats)]
    assert main(argv) == EXIT_REJECTED
    err = capsys.readouterr().err
    s = stats_of(stats)
    kinds = s["decisions"]
    assert set(kinds) == {"unique", "duplicate", "contained", "contains"}
    assert s["pages"] == len(SAMPLE.read_text(encoding="utf-8").splitlines())
    assert s["decided"] == sum(kinds.values()) == len(read(out))
    assert s["rejects"] == {"bad_json": 1, "not_html": 1} and s["rejected"] == 2
    head = f"neardup: {s['pages']} pages in {s['seconds']:.1f} s "
    assert head in err
    assert f"{s['decided']} decided ({kinds['unique']} unique, " in err
    assert f"2 pages rejected (bad_json 1, not_html 1), written to {rj}" in err
    assert "{" not in err and "Counter" not in err  # no Python reprs


def test_extract_says_what_it_did_and_why_it_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, stats = tmp_path / "t.jsonl", tmp_path / "s.json"
    assert main(["extract", str(SAMPLE), "--out", str(out), "--stats", str(stats)]) == 3
    err = capsys.readouterr().err
    s = stats_of(stats)
    assert s["extracted"] == len(read(out)) and s["rejects"] == {"bad_json": 1, "not_html": 1}
    assert f"{s['pages']} pages in " in err and f": {s['extracted']} extracted" in err
    assert "2 pages rejected (bad_json 1, not_html 1), not kept (--rejects FILE keeps them)" in err
    # quiet: no summary, but still the line that explains the exit status
    rj = tmp_path / "r.jsonl"
    argv = ["extract", str(SAMPLE), "--out", str(out), "--rejects", str(rj), "-q"]
    assert main(argv) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert err == f"neardup: 2 pages rejected (bad_json 1, not_html 1), written to {rj}\n"


@pytest.mark.parametrize(
    ("content", "looks"),
    [
        (b"<!DOCTYPE html>\n<html><body><p>hello</p></body></html>\n", "HTML or XML"),
        (b"url,fetched_at,title\nhttps://a.example.cn/,2024-01-01,x\n" * 50, "starts 'url,"),
        (b"\x00\x01\x02binary\xff\xfe\n" * 50, "binary data"),
    ],
)
def test_a_file_that_is_not_jsonl_gets_one_hint_and_its_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, looks: str
) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(content)
    out, rj = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    code = main(["dedup", str(data), "--out", str(out), "--rejects", str(rj), "-q"])
    assert code == EXIT_REJECTED
    hints = [x for x in capsys.readouterr().err.splitlines() if "hint" in x]
    assert len(hints) == 1
    assert f"{data} is not JSONL" in hints[0] and looks in hints[0]
    assert "WARC" in hints[0] and "content_type" in hints[0]
    assert len(read(rj)) == len([x for x in content.splitlines() if x.strip()])


def test_a_jsonl_file_with_some_broken_lines_gets_no_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["dedup", str(SAMPLE), "--out", str(tmp_path / "d.jsonl"), "-q"])  # line 8 is broken
    assert "hint" not in capsys.readouterr().err


def test_a_directory_as_input_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("dedup", "extract"):
        with pytest.raises(SystemExit) as exc:
            main([command, str(SAMPLE), str(tmp_path), "--out", str(tmp_path / "o.jsonl")])
        assert exc.value.code == EXIT_USAGE
        assert f"{tmp_path} is a directory" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "outputs",
    [
        ["--out", "{state}"],
        ["--out", "{state}/d.jsonl"],
        ["--out", "{tmp}/d.jsonl", "--rejects", "{state}/r.jsonl"],
        ["--out", "{tmp}/d.jsonl", "--stats", "{state}"],
        ["--out", "{tmp}/d.jsonl", "--stats", "{tmp}/d.jsonl"],
    ],
)
def test_outputs_inside_the_state_are_usage_errors(tmp_path: Path, outputs: list[str]) -> None:
    state = tmp_path / "state"
    args = [o.format(state=state, tmp=tmp_path) for o in outputs]
    with pytest.raises(SystemExit) as exc:
        main(["dedup", str(SAMPLE), *args, "--state", str(state)])
    assert exc.value.code == EXIT_USAGE
    assert not state.exists() and not (tmp_path / "d.jsonl").exists()


def test_an_input_inside_the_state_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "pages.jsonl").write_bytes(SAMPLE.read_bytes())
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "dedup",
                str(state / "pages.jsonl"),
                "--out",
                str(tmp_path / "d"),
                "--state",
                str(state),
            ]
        )
    assert exc.value.code == EXIT_USAGE
    assert f"is the --state directory {state}, or inside it" in capsys.readouterr().err


def test_the_bar_shows_bytes_percent_and_time_left_for_files(tmp_path: Path) -> None:
    pages = tmp_path / "pages.jsonl.gz"
    with gzip.open(pages, "wb") as fh:
        fh.write(SAMPLE.read_bytes())
    reading = Reading()
    shown = io.StringIO()
    bar = Bar([str(pages)], reading, file=shown)
    n = 0
    for n, _ in enumerate(iter_pages([str(pages)], 1 << 20, reading=reading), 1):
        bar.tick(n, force=True)
    bar.tick(n, force=True)
    bar.close()
    # a gzip file counts by its compressed bytes: all of them once it is read
    assert reading.bytes_read() == pages.stat().st_size
    last = shown.getvalue().rsplit("\r", 1)[-1]
    assert "100%" in last and f"{n} pages" in last
    assert "<" in shown.getvalue()  # tqdm's elapsed<remaining


def test_the_bar_counts_pages_when_the_size_is_unknown() -> None:
    shown = io.StringIO()
    bar = Bar(["-"], Reading(), file=shown)
    bar.tick(7, force=True)
    bar.close()
    assert "7page" in shown.getvalue().replace(" ", "") and "%" not in shown.getvalue()


def test_no_bar_unless_standard_error_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = Bar([str(SAMPLE)], Reading())
    bar.tick(3, force=True)
    bar.close()
    assert sys.stderr.getvalue() == ""


def test_help_says_content_type_is_required_and_what_stats_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["dedup", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "content_type (the HTTP header, '' if unknown: required with html as with" in text
    assert "--stats FILE" in text and "skipped (decided by an earlier run with --state)" in text
    assert "is skipped: not analysed again, nothing written to --out" in text


def demo_table(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_table", ROOT / "scripts" / "demo_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://news.example.cn/a.html", "news.example.cn/a.html"),
        (
            "https://news.example.cn/2024/0101/society/city/article-12345.html",
            "news.example.cn/…city/article-12345.html",
        ),
    ],
)
def test_the_demo_table_keeps_the_host_and_the_end_of_a_url(
    monkeypatch: pytest.MonkeyPatch, url: str, shown: str
) -> None:
    short = demo_table(monkeypatch).short_url(url, 40)
    assert short == shown and len(short) <= 40


def test_stats_may_go_to_standard_output_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.jsonl"
    assert main(["dedup", str(SAMPLE), "--out", str(out), "--stats", "-", "-q"]) == 3
    assert json.loads(capsys.readouterr().out)["decided"] == len(read(out))
    with pytest.raises(SystemExit) as exc:
        main(["dedup", str(SAMPLE), "--out", "-", "--stats", "-"])
    assert exc.value.code == EXIT_USAGE
    assert "would mix them" in capsys.readouterr().err
