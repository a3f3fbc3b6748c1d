"""Answers from a state directory: `neardup query`, `neardup clusters`, and the reader under
them, over a state written by two runs."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup.cli import main
from neardup.config import EngineConfig
from neardup.contract import derive_page_id, parse_raw, validate
from neardup.engine import Engine, Outcome, page_pid
from neardup.lookup import StateReader
from neardup.query import EXIT_NOT_FOUND, shown
from neardup.store import MARKER_KEY, MemoryKV, RocksKV, StateError, open_state, open_to_read
from tests.corpus import ARTICLES, line, raw_page

CFG = EngineConfig().with_overrides(extract_timeout_s=0)
HOSTILE_TITLE = "&lt;script&gt;alert(1)&lt;/script&gt; \x1b[31m红色&quot;&amp;"
HOSTILE_URL = 'https://evil.example.cn/x?q="><script>alert(2)</script>'
RAIL = "https://a.example.cn/rail"


def _at(hour: int) -> str:
    return f"2026-03-01T{hour:02d}:00:00Z"


# Two runs against one state: the second adds pages, one joining the first run's cluster.
FIRST_RUN = [
    raw_page(RAIL, ARTICLES["rail"], "地铁开通", fetched_at=_at(1)),
    raw_page(
        "https://b.example.cn/rail", ARTICLES["rail"], "地铁", template="blog", fetched_at=_at(2)
    ),
    raw_page("https://a.example.cn/harvest", ARTICLES["harvest"], "夏粮", fetched_at=_at(3)),
    raw_page("https://d.example.cn/part", ARTICLES["harvest"][:3], "夏粮", fetched_at=_at(4)),
    raw_page("https://a.example.cn/museum", ARTICLES["museum"], "博物馆", fetched_at=_at(5)),
    raw_page(
        "https://g.example.cn/museum",
        ARTICLES["museum"],
        HOSTILE_TITLE,
        fetched_at=_at(5),
        template="blog",
    ),
    raw_page(
        "https://e.example.cn/lib", ARTICLES["library"], "图书馆", fetched_at=_at(6), page_id="s-42"
    ),
]
SECOND_RUN = [
    raw_page("https://a.example.cn/heat", ARTICLES["heatwave"], "高温", fetched_at=_at(7)),
    raw_page(
        "https://f.example.cn/rail", ARTICLES["rail"], "转载", template="blog", fetched_at=_at(8)
    ),
    raw_page(HOSTILE_URL, ARTICLES["heatwave"], "高温", template="blog", fetched_at=_at(9)),
    raw_page("https://a.example.cn/startup", ARTICLES["startup"], "融资", fetched_at=_at(10)),
]


@dataclass
class Built:
    path: str
    decisions: dict[str, dict[str, Any]]
    #: page id -> cluster id, as the engine's union-find says at the end
    cluster_of: dict[str, str]


def build_state(path: str, runs: list[list[dict[str, str]]]) -> Built:
    """A RocksDB state made by one engine session a run; every decision, and each page's
    cluster by the engine's own reckoning."""
    decisions: dict[str, dict[str, Any]] = {}
    for run in runs:
        engine = Engine(open_state(path, CFG), CFG)
        for msg in run:
            out = engine.process(parse_raw(line(msg), CFG.max_bytes))
            assert isinstance(out, Outcome), out
            decisions[out.decision["page_id"]] = out.decision
        clusters = {pid: engine.cluster_of(pid) for pid in decisions}
        engine.close()
    return Built(path, decisions, clusters)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    path = str(tmp_path_factory.mktemp("state") / "state")
    return build_state(path, [FIRST_RUN, SECOND_RUN])


def query(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_state_built_has_the_cases_the_tests_need(built: Built) -> None:
    kinds = {d["url"]: d["decision"] for d in built.decisions.values()}
    assert kinds["https://b.example.cn/rail"] == "duplicate"
    assert kinds["https://f.example.cn/rail"] == "duplicate"
    assert kinds["https://d.example.cn/part"] == "contained"
    assert kinds["https://g.example.cn/museum"] == "duplicate"
    assert kinds[HOSTILE_URL] == "duplicate"
    assert built.decisions["s-42"]["decision"] == "unique"
    assert all(validate("decision", d) == [] for d in built.decisions.values())


def test_every_cluster_of_every_run_is_listed_as_the_engine_has_it(built: Built) -> None:
    kv = open_to_read(built.path)
    listed = list(StateReader(kv).clusters(min_size=1))
    kv.close()
    want: dict[str, set[str]] = {}
    for page_id, cluster in built.cluster_of.items():
        want.setdefault(cluster, set()).add(page_id)
    got = {c.cluster_id: {m.page_id for m in c.members} for c in listed}
    assert got == want
    sizes = [c.size for c in listed]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 3  # the rail pages, two runs
    rail = listed[0]
    assert rail.members[0].url == RAIL  # the earliest first, and the name
    assert rail.cluster_id == derive_page_id(RAIL)


def test_clusters_merged_by_a_later_page_are_listed_as_one(tmp_path: Path) -> None:
    # the museum pair's root is put under the library page's when a page containing both
    # comes: the pair's second page then reaches its root through two parents
    both = ARTICLES["library"] + ARTICLES["museum"]
    built = build_state(
        str(tmp_path / "state"),
        [
            [
                raw_page(
                    "https://a.example.cn/lib", ARTICLES["library"], "图书馆", fetched_at=_at(1)
                ),
                raw_page(
                    "https://a.example.cn/mus", ARTICLES["museum"], "博物馆", fetched_at=_at(2)
                ),
                raw_page(
                    "https://b.example.cn/mus",
                    ARTICLES["museum"],
                    "馆",
                    template="blog",
                    fetched_at=_at(3),
                ),
                raw_page("https://c.example.cn/both", both, "合集", fetched_at=_at(4)),
            ]
        ],
    )
    assert len(set(built.cluster_of.values())) == 1
    kv = open_to_read(built.path)
    parents = {k: v for k, v in kv.scan(b"U")}
    assert any(b"U" + v in parents for v in parents.values())  # a chain of two parents
    (cluster,) = StateReader(kv).clusters()
    kv.close()
    assert cluster.cluster_id == derive_page_id("https://a.example.cn/lib")
    assert {m.page_id for m in cluster.members} == set(built.decisions)


def test_a_state_in_memory_reads_as_one_on_disk(built: Built) -> None:
    kv = MemoryKV()
    engine = Engine(kv, CFG)
    for msg in FIRST_RUN + SECOND_RUN:
        assert isinstance(engine.process(parse_raw(line(msg), CFG.max_bytes)), Outcome)
    memory = [c.to_json() for c in StateReader(kv).clusters(min_size=1)]
    disk = open_to_read(built.path)
    assert memory == [c.to_json() for c in StateReader(disk).clusters(min_size=1)]
    disk.close()


def test_query_by_url_by_page_id_and_by_the_url_of_a_page_with_its_own_id(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = "https://f.example.cn/rail"
    code, out, _ = query(
        capsys, "query", "--state", built.path, "--json", copy, derive_page_id(RAIL),
        "https://e.example.cn/lib",
    )  # fmt: skip
    assert code == 0
    answers = [json.loads(x) for x in out.splitlines()]
    assert [a["page"]["url"] for a in answers] == [copy, RAIL, "https://e.example.cn/lib"]
    first = answers[0]
    assert first["decision"]["duplicate_of_url"] in (RAIL, "https://b.example.cn/rail")
    assert first["decision"] == built.decisions[derive_page_id(copy)]
    members = [m["url"] for m in first["cluster"]["members"]]
    assert members == [RAIL, "https://b.example.cn/rail", copy]
    assert first["cluster"]["members"][0]["title"] == "地铁开通"
    assert answers[2]["page"]["page_id"] == "s-42"
    assert answers[2]["cluster"]["size"] == 1


def test_readable_answer_names_the_url_duplicated_and_the_members(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = query(capsys, "query", "--state", built.path, "https://d.example.cn/part")
    assert code == 0
    assert "contained in https://a.example.cn/harvest" in out
    assert "2 pages:" in out
    marked = [ln for ln in out.splitlines() if ln.startswith("   * ")]
    assert len(marked) == 1 and "https://d.example.cn/part" in marked[0]


def test_page_supplied_strings_cannot_drive_the_terminal(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = query(capsys, "query", "--state", built.path, "https://g.example.cn/museum")
    assert code == 0
    assert "\x1b" not in out
    assert "\\u001b[31m红色" in out
    assert shown("a\u202eb\nc", 3) == "a\\…"


def test_an_unknown_page_is_reported_and_exits_non_zero(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = query(
        capsys, "query", "--state", built.path, "https://nowhere.example.cn/", RAIL
    )
    assert code == EXIT_NOT_FOUND
    assert "'https://nowhere.example.cn/' is no page id or URL of a page in the state" in err
    assert RAIL in out  # the known page is still answered
    code, out, _ = query(capsys, "query", "--state", built.path, "--json", "0123abcd")
    assert code == EXIT_NOT_FOUND
    assert json.loads(out) == {"query": "0123abcd", "found": False}


def test_a_reader_gone_ends_the_answer_without_a_traceback(
    built: Built, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["query", "--state", built.path, RAIL]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_clusters_command_writes_the_whole_state(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "clusters.jsonl"
    code, _, err = query(capsys, "clusters", "--state", built.path, "--out", str(out))
    assert code == 0
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["size"] for r in rows] == [3, 2, 2, 2]
    assert {m["url"] for m in rows[0]["members"]} >= {RAIL, "https://f.example.cn/rail"}
    assert "4 clusters of 2 or more pages, 9 pages in them" in err
    code, _, _ = query(
        capsys, "clusters", "--state", built.path, "--out", str(out), "--min-size", "1", "-q"
    )
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert sum(r["size"] for r in rows) == len(built.decisions)
    assert len(rows) == len(set(built.cluster_of.values()))


def test_a_state_written_before_decisions_had_duplicate_of_url_is_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = build_state(str(tmp_path / "old"), [FIRST_RUN[:2]])
    kv = RocksKV(built.path)
    for page_id in built.decisions:
        key = b"M" + page_pid(page_id).to_bytes(8, "big")
        (raw,) = kv.get_many([key])
        assert raw is not None
        rec = orjson.loads(raw)
        del rec["decision"]["duplicate_of_url"]
        kv.put_many([(key, orjson.dumps(rec))])
    kv.close()
    code, out, _ = query(
        capsys, "query", "--state", built.path, "--json", "https://b.example.cn/rail"
    )
    assert code == 0
    assert json.loads(out)["decision"]["duplicate_of_url"] == RAIL


def test_the_state_is_read_while_a_run_holds_it_open(built: Built) -> None:
    writer = RocksKV(built.path)
    try:
        kv = open_to_read(built.path)
        assert sum(1 for _ in StateReader(kv).pages()) == len(built.decisions)
        kv.close()
    finally:
        writer.close()


def test_states_that_cannot_be_read_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    code, _, err = query(capsys, "query", "--state", str(missing), RAIL)
    assert code == 1 and "no state at" in err and "no such directory" in err
    assert not missing.exists()  # reading never makes a directory
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = query(capsys, "clusters", "--state", str(empty), "--out", "-")
    assert code == 1 and "holds no RocksDB data" in err
    assert os.listdir(empty) == []
    other = RocksKV(str(tmp_path / "other"))
    other.put_many([(b"k", b"v")])
    other.close()
    with pytest.raises(StateError, match="not neardup state"):
        open_to_read(str(tmp_path / "other"))
    newer = RocksKV(str(tmp_path / "newer"))
    newer.put_many([(MARKER_KEY, json.dumps({"format": 99, "written_by": "9.0"}).encode())])
    newer.close()
    code, _, err = query(capsys, "report", "--state", str(tmp_path / "newer"), "--out", "-")
    assert code == 1 and "written with format 99" in err and "reads format 1" in err
