"""The Python API (``neardup.dedup``, ``neardup.extract_text``): the command line's
decisions, state that carries across calls, and bad pages as data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import neardup
from neardup.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample.jsonl"


def _pages() -> list[dict[str, Any]]:
    """The sample's pages as dicts: every line but the one broken on purpose."""
    pages = []
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        try:
            pages.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    assert len(pages) > 10
    return pages


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "decided_at"}


def _split(results: list[neardup.Decision | neardup.Rejected]) -> tuple[list[Any], list[Any]]:
    decided = [_comparable(r.to_json()) for r in results if isinstance(r, neardup.Decision)]
    rejected = [(r.reason, r.page_id, r.url) for r in results if isinstance(r, neardup.Rejected)]
    return decided, rejected


def test_dedup_decides_the_sample_as_the_command_line_does(tmp_path: Path) -> None:
    out, rejects = tmp_path / "decisions.jsonl", tmp_path / "rejects.jsonl"
    main(["dedup", str(SAMPLE), "--out", str(out), "--rejects", str(rejects), "-q"])
    cli_decided = [_comparable(json.loads(x)) for x in out.read_text("utf-8").splitlines()]
    cli_rejected = [
        (r["reason"], r["page_id"], r["url"])
        for r in map(json.loads, rejects.read_text("utf-8").splitlines())
    ]

    from_file = _split(list(neardup.dedup(neardup.read_pages(SAMPLE))))
    decided, rejected = _split(list(neardup.dedup(_pages())))

    assert from_file == (cli_decided, cli_rejected)
    assert decided == cli_decided
    # all but the line that is no JSON, which _pages could not make a dict of
    assert rejected == [r for r in cli_rejected if r[0] != "bad_json"]
    assert len(rejected) < len(cli_rejected)
    kinds = {d["decision"] for d in decided}
    assert "unique" in kinds and kinds - {"unique"}, "the sample holds near-duplicates"


def test_raw_page_records_give_the_same_decisions_as_dicts() -> None:
    from_dicts, _ = _split(list(neardup.dedup(_pages())))
    records = [p for p in neardup.read_pages(SAMPLE) if isinstance(p, neardup.RawPage)]
    from_records, _ = _split(list(neardup.dedup(records)))
    assert from_records == from_dicts


def test_decision_properties_read_the_message() -> None:
    decisions = [d for d in neardup.dedup(_pages()) if isinstance(d, neardup.Decision)]
    by_id = {d.page_id: d for d in decisions}
    for d in decisions:
        message = d.to_json()
        assert (d.page_id, d.url, d.kind, d.cluster_id) == (
            message["page_id"],
            message["url"],
            message["decision"],
            message["cluster_id"],
        )
        assert (d.duplicate_of, d.title) == (message["duplicate_of"], message["title"])
        if d.duplicate_of is not None:
            assert d.duplicate_of in by_id  # an earlier page of this same call
            assert d.duplicate_of_url == by_id[d.duplicate_of].url
            assert d.cluster_id == by_id[d.duplicate_of].cluster_id


def test_a_state_directory_continues_across_calls(tmp_path: Path) -> None:
    pages = _pages()
    in_one_call, _ = _split(list(neardup.dedup(pages)))
    state = tmp_path / "state"
    first, _ = _split(list(neardup.dedup(pages[:7], state=state)))
    second, _ = _split(list(neardup.dedup(pages[7:], state=state)))
    assert first + second == in_one_call  # the second call saw the first call's pages

    again = list(neardup.dedup(pages[:3], state=state))
    assert all(isinstance(d, neardup.Decision) and d.repeated for d in again)
    assert _split(again)[0] == in_one_call[:3]


def test_state_made_with_other_parameters_is_refused(tmp_path: Path) -> None:
    list(neardup.dedup(_pages()[:2], state=tmp_path))
    other = neardup.EngineConfig().with_overrides(period_len=neardup.EngineConfig().period_len + 1)
    with pytest.raises(neardup.StateError, match="parameters"):
        list(neardup.dedup(_pages()[:2], state=tmp_path, config=other))


def test_bad_pages_are_rejected_and_the_rest_decided() -> None:
    good = _pages()[:2]
    bad: list[Any] = [
        {"url": "https://a.example/1", "fetched_at": "2026-01-01T00:00:00Z"},  # no body
        {**good[0], "page_id": "x1", "fetched_at": "yesterday"},
        {**good[0], "page_id": "x2", "html": b"<p>bytes</p>"},  # not JSON
        42,
        neardup.RawPage("x3", "https://a.example/3", "not a time", "text/html", "<p>x</p>"),
    ]
    results = list(neardup.dedup([good[0], *bad, good[1]]))
    assert [type(r).__name__ for r in results] == ["Decision", *["Rejected"] * 5, "Decision"]
    reasons = [r.reason for r in results if isinstance(r, neardup.Rejected)]
    assert reasons == ["schema", "schema", "bad_json", "schema", "schema"]
    assert all(r.detail for r in results if isinstance(r, neardup.Rejected))


def test_a_path_instead_of_pages_is_a_usage_error() -> None:
    with pytest.raises(TypeError, match="read_pages"):
        neardup.dedup(str(SAMPLE))  # type: ignore[arg-type]


def test_extract_text_gives_the_title_and_main_text() -> None:
    page = _pages()[0]
    extracted = neardup.extract_text(page)
    assert isinstance(extracted, neardup.Extracted)
    assert extracted.title and extracted.title in page["html"]
    assert len(extracted.text) > 50
    assert "首页" not in extracted.text  # the navigation bar is not main text
    (pdf,) = [p for p in _pages() if p["url"].endswith(".pdf")]
    rejected = neardup.extract_text(pdf)
    assert isinstance(rejected, neardup.Rejected) and rejected.reason == "not_html"
    assert isinstance(neardup.extract_text({"url": "https://a.example/"}), neardup.Rejected)


def test_the_top_level_names_resolve_and_import_stays_light() -> None:
    for name in neardup.__all__:
        assert getattr(neardup, name) is not None
    code = "import sys, neardup; print(sorted(m for m in ('numpy', 'neardup.engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python_api.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "duplicate" in out.stdout
    assert "https://" in out.stdout
