"""The neardup command line on the bundled sample."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neardup.cli import EXIT_FATAL, EXIT_REJECTED, EXIT_USAGE, main
from neardup.contract import validate

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample.jsonl"


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_dedup_writes_every_output_and_says_pages_were_rejected(tmp_path: Path) -> None:
    out, cl, mg, rj = (tmp_path / n for n in ("d.jsonl", "c.jsonl", "m.jsonl", "r.jsonl"))
    code = main(
        [
            "dedup",
            str(SAMPLE),
            "--out",
            str(out),
            "--clusters",
            str(cl),
            "--merges",
            str(mg),
            "--rejects",
            str(rj),
            "-q",
        ]
    )
    assert code == EXIT_REJECTED
    decisions, rejects = read(out), read(rj)
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    assert len(decisions) + len(rejects) == len(lines)
    assert {r["reason"] for r in rejects} == {"bad_json", "not_html"}
    assert all(validate("decision", d) == [] for d in decisions)
    assert all(validate("rejected", r) == [] for r in rejects)
    kinds = {d["decision"] for d in decisions}
    assert {"unique", "duplicate", "contains"} <= kinds
    clusters = {c["page_id"]: c["cluster_id"] for c in read(cl)}
    assert set(clusters) == {d["page_id"] for d in decisions}
    # decisions come in input order
    rejected = {r["url"] for r in rejects}
    urls = []
    for x in lines:
        try:
            urls.append(json.loads(x)["url"])
        except ValueError:
            continue
    assert [d["url"] for d in decisions] == [u for u in urls if u not in rejected]


def test_second_run_with_state_continues(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    head, tail = tmp_path / "head.jsonl.gz", tmp_path / "tail.jsonl"
    with gzip.open(head, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines[:5]) + "\n")
    tail.write_text("\n".join(lines[5:]) + "\n", encoding="utf-8")
    main(["dedup", str(head), "--out", str(first), "--state", str(state), "-q"])
    main(["dedup", str(tail), "--out", str(second), "--state", str(state), "-q"])
    whole = tmp_path / "whole.jsonl"
    main(["dedup", str(SAMPLE), "--out", str(whole), "-q"])

    def strip(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "decided_at"} for r in rows]

    assert strip(read(first) + read(second)) == strip(read(whole))


def test_state_with_other_parameters_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    main(["dedup", str(SAMPLE), "--out", str(tmp_path / "a"), "--state", state, "-q"])
    code = main(
        [
            "dedup",
            str(SAMPLE),
            "--out",
            str(tmp_path / "b"),
            "--state",
            state,
            "--set",
            "period_len=12",
            "-q",
        ]
    )
    assert code == EXIT_FATAL
    assert "new directory" in capsys.readouterr().err


def test_extract_writes_title_and_text(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["extract", str(SAMPLE), "--out", str(out)]) == EXIT_REJECTED
    rows = read(out)
    assert rows and all(set(r) == {"page_id", "url", "title", "text"} for r in rows)
    gbk = next(r for r in rows if r["url"] == "https://www.example.org/museum.html")
    assert "航海" in str(gbk["text"]) and "版权所有" not in str(gbk["text"])


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["dedup", "--help"], ["extract", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--clusters", "--merges", "--rejects", "--state", "--cache-mb"):
        assert option in text
    assert "--set" in text


@pytest.mark.parametrize(
    ("value", "says"),
    [("0", "must be at least 1"), ("-5", "must be at least 1"), ("lots", "not a whole number")],
)
def test_a_cache_size_that_is_not_a_positive_number_is_a_usage_error(
    tmp_path: Path, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["dedup", str(SAMPLE), "--out", str(tmp_path / "x"), "--cache-mb", value])
    assert exc.value.code == EXIT_USAGE
    assert f"--cache-mb: {says}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_state_path_that_cannot_be_a_directory_is_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    for state in (afile, afile / "sub"):
        code = main(["dedup", str(SAMPLE), "--out", str(tmp_path / "o"), "--state", str(state)])
        assert code == EXIT_FATAL
        err = capsys.readouterr().err
        assert err.startswith(f"neardup: cannot create RocksDB state at {state}: "), err
        assert "Traceback" not in err


def test_the_state_takes_the_cache_size_given(tmp_path: Path) -> None:
    out, state = tmp_path / "d.jsonl", tmp_path / "state"
    argv = ["dedup", str(SAMPLE), "--out", str(out), "--state", str(state), "--cache-mb", "8", "-q"]
    assert main(argv) in (0, EXIT_REJECTED)
    assert read(out)


@pytest.mark.parametrize(
    ("setting", "says"),
    [("k1=9", "k1 <= k2"), ("k1=abc", "k1 takes int"), ("extractor=bogus", "extractor must be")],
)
def test_bad_setting_is_refused_with_a_message(tmp_path: Path, setting: str, says: str) -> None:
    with pytest.raises(SystemExit, match=f"bad engine setting: .*{says}"):
        main(["dedup", str(SAMPLE), "--out", str(tmp_path / "x"), "--set", setting])


def test_a_missing_input_is_a_usage_error_that_leaves_the_output_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "decisions.jsonl"
    out.write_text("an earlier run's decisions\n", encoding="utf-8")
    for command in ("dedup", "extract"):
        with pytest.raises(SystemExit) as exc:
            main([command, str(SAMPLE), str(tmp_path / "typo.jsonl"), "--out", str(out)])
        assert exc.value.code == EXIT_USAGE
        assert "no such input file" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "an earlier run's decisions\n"


def test_a_reject_from_a_file_whose_name_is_not_utf8_is_written(tmp_path: Path) -> None:
    import os

    # the detail names the file, whose name is not UTF-8: it must still encode
    name = Path(os.fsdecode(bytes(tmp_path) + b"/pages\xff.jsonl"))
    name.write_bytes(b'{"broken\n' + SAMPLE.read_bytes().splitlines(keepends=True)[0])
    out, rj = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    code = main(["dedup", str(name), "--out", str(out), "--rejects", str(rj), "-q"])
    assert code == EXIT_REJECTED
    [reject] = read(rj)
    assert str(reject["detail"]).startswith(f"{tmp_path}/pages\\xff.jsonl:1: ")
    assert len(read(out)) == 1


def test_closed_stdin_is_a_reject_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", None)  # `neardup dedup - <&-`
    out, rj = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    assert main(["dedup", "-", "--out", str(out), "--rejects", str(rj), "-q"]) == EXIT_REJECTED
    assert [r["reason"] for r in read(rj)] == ["bad_input"]


def test_pages_from_a_pipe_are_all_read(tmp_path: Path) -> None:
    import os
    import threading

    # `neardup dedup <(cat pages.jsonl)`: a pipe gives its bytes once, so the bytes read to
    # tell its format must be kept for the pages, or there are none left to decide
    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb") as fh:
            fh.write(SAMPLE.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    out, rj = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    try:
        code = main(["dedup", f"/dev/fd/{read_end}", "--out", str(out), "--rejects", str(rj), "-q"])
    finally:
        os.close(read_end)
    writer.join()
    assert code == EXIT_REJECTED
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    assert len(read(out)) + len(read(rj)) == len(lines)


def test_installed_console_script_runs() -> None:
    import subprocess
    import sys

    # the script pip installed next to this interpreter (PATH need not include it)
    script = Path(sys.executable).parent / "neardup"
    assert script.exists()
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("neardup ")


def test_outputs_that_would_destroy_data_are_usage_errors(tmp_path: Path) -> None:
    pages = tmp_path / "pages.jsonl"
    pages.write_bytes(SAMPLE.read_bytes())
    for outputs in (
        ["--out", str(pages)],  # would empty the input before reading it
        ["--out", str(tmp_path / "a"), "--rejects", str(tmp_path / "a")],
        ["--out", str(tmp_path / "a"), "--clusters", str(tmp_path / "." / "a")],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["dedup", str(pages), *outputs])
        assert exc.value.code == EXIT_USAGE
    assert pages.read_bytes() == SAMPLE.read_bytes()
    # a device is no file to overwrite: two outputs may go there
    argv = ["dedup", str(pages), "--out", "/dev/null", "--rejects", "/dev/null", "-q"]
    assert main(argv) == EXIT_REJECTED


def test_an_output_that_cannot_be_written_is_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for outputs in (
        ["--out", str(tmp_path / "no-dir" / "d.jsonl")],
        ["--out", "/dev/full"],
        ["--out", str(tmp_path / "d.jsonl"), "--clusters", str(tmp_path / "no-dir" / "c")],
    ):
        assert main(["dedup", str(SAMPLE), *outputs, "-q"]) == EXIT_FATAL
        assert "neardup: cannot write " in capsys.readouterr().err


def test_an_interrupt_leaves_whole_lines_and_a_state_to_continue_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from neardup import sources

    original = sources.iter_pages

    def interrupted(paths: list[str], max_bytes: int, **kw: Any) -> Iterator[object]:
        for i, page in enumerate(original(paths, max_bytes, **kw)):
            if i == 6:
                raise KeyboardInterrupt
            yield page

    monkeypatch.setattr(sources, "iter_pages", interrupted)
    out, state = tmp_path / "d.jsonl", tmp_path / "state"
    assert main(["dedup", str(SAMPLE), "--out", str(out), "--state", str(state), "-q"]) == 130
    assert "interrupted" in capsys.readouterr().err
    first = read(out)  # whole JSON lines only
    assert 0 < len(first) <= 6
    monkeypatch.setattr(sources, "iter_pages", original)
    again, whole = tmp_path / "again.jsonl", tmp_path / "whole.jsonl"
    main(["dedup", str(SAMPLE), "--out", str(again), "--state", str(state), "-q"])
    main(["dedup", str(SAMPLE), "--out", str(whole), "-q"])
    # the pages decided before are skipped; the rest are decided as in one whole run
    assert not {d["page_id"] for d in first} & {d["page_id"] for d in read(again)}

    def strip(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return sorted((r["page_id"], r["decision"], r["duplicate_of"]) for r in rows)

    assert strip(first + read(again)) == strip(read(whole))


def test_the_summary_says_what_the_bounds_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.corpus import line, raw_page

    text = ["市气象台今天发布寒潮蓝色预警，预计明天起气温将下降八到十度。", "请市民注意防寒保暖。"]
    pages = tmp_path / "pages.jsonl"
    pages.write_text(
        "".join(
            line(
                raw_page(
                    f"https://s{i}.example.cn/a",
                    text,
                    "寒潮来袭",
                    fetched_at=f"2026-03-{i + 1:02}T00:00:00Z",
                )
            )
            + "\n"
            for i in range(20)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "d.jsonl"
    sets = [
        "--set",
        "bucket_cap=16",
        "--set",
        "template_idle_days=4",
        "--set",
        "extract_timeout_s=0",
    ]
    assert main(["dedup", str(pages), "--out", str(out), *sets]) == 0
    assert len(read(out)) == 20
    err = capsys.readouterr().err
    # 20 pages of one short text: 8 SimHash buckets, 2 period strings and 8 of its smallest
    # 5-gram hashes each, full after 16
    assert "index entries not added, bucket full: simhash 32, strings 8, minhash 32;" in err
    # a new host a day, 4 idle days allowed: by the 20th day the first 15 are swept
    assert "hosts idle past template_idle_days whose counts were dropped: 15\n" in err
