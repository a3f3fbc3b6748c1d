"""Unit tests of the small stages: normalise, template filter, clusters, decide, config."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.cluster import Clusters, PageKey
from neardup.config import EngineConfig
from neardup.decide import Candidate, Kind, candidates, matches
from neardup.fingerprint import Fingerprints
from neardup.index import ENTRY, Lookup
from neardup.normalise import normalise, normalise_many
from neardup.sketch import bottom_k
from neardup.store import BufferedKV, MemoryKV
from neardup.template import TemplateFilter

CFG = EngineConfig()


# -- normalise -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("這是臺灣的新聞。", "这是台湾的新闻。"),
        ("ＡＢＣ１２３", "abc123"),
        ("“引号”「引號」，逗号；分号！", '"引号""引号",逗号;分号!'),
        ("多个　　空格\t和\u200b零宽", "多个 空格 和零宽"),
        ("第一段\n\n\n  第二段  ", "第一段\n第二段"),
        ("句号。保留", "句号。保留"),
    ],
)
def test_normalise(raw: str, want: str) -> None:
    assert normalise(raw) == want


def test_normalise_ignores_a_t2s_json_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenCC("t2s") would read ./t2s.json before its own: a file there must not change
    the conversion (nor any fingerprint)."""
    from neardup import normalise as module

    (tmp_path / "t2s.json").write_text('{"name": "not t2s", "conversion_chain": []}')
    monkeypatch.chdir(tmp_path)
    module._t2s.cache_clear()
    try:
        assert normalise("這是臺灣的新聞。") == "这是台湾的新闻。"
    finally:
        module._t2s.cache_clear()


def test_normalise_is_idempotent() -> None:
    text = "國務院總理今天（３月１日）表示：「經濟穩中向好」。"
    assert normalise(normalise(text)) == normalise(text)


# Lines that exercise every step: Traditional phrases (OpenCC converts some as phrases),
# full-width forms, punctuation variants, odd spaces, case (a Greek final sigma depends on
# what follows it), invisible characters and empty lines.
_LINES = [
    "這是臺灣的新聞。",
    "乾隆皇帝瞭望遠方，頭髮很長",
    "ＡＢＣ１２３ΟΔΟΣ",
    "ΣΑΣ",
    "“引号”「引號」，逗号；分号！",
    "  多个　　空格\t和\u200b零宽 ",
    "",
    "   ",
    "句号。保留…",
    "\u00a0",
    "ﾊﾝｶｸ ｶﾀｶﾅ",
]


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(
        st.lists(st.one_of(st.sampled_from(_LINES), st.text(max_size=12)), max_size=8).map(
            "\n".join
        ),
        min_size=1,
        max_size=3,
    )
)
def test_normalising_many_texts_at_once_is_normalising_each(texts: list[str]) -> None:
    assert normalise_many(texts) == [normalise(t) for t in texts]


# -- template filter -----------------------------------------------------------------


def test_template_strings_are_learnt_per_host() -> None:
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG.with_overrides(template_min_df=3))
    for i in range(3):
        template, seen = tf.filter("a.example.cn", [1, 2, 100 + i])
        kv.commit()
        assert template == set() and seen == i
    template, _ = tf.filter("a.example.cn", [1, 2, 999])
    assert template == {1, 2}
    other, seen = tf.filter("b.example.cn", [1, 2])
    assert other == set() and seen == 0


def test_template_strings_are_learnt_from_prose_outside_the_main_text() -> None:
    # String 7 is a template paragraph the extractor left out of three pages' main text
    # (it was only in their prose); on the fourth page it is in the main text: template.
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG.with_overrides(template_min_df=3))
    for i in range(3):
        template, _ = tf.filter("a.example.cn", [100 + i], also=[7, 100 + i])
        kv.commit()
        assert template == set()
    template, _ = tf.filter("a.example.cn", [7, 999], also=[8])
    assert template == {7}  # only strings of the main text are reported
    kv.commit()
    template, _ = tf.filter("a.example.cn", [8], also=[])
    assert template == set()  # 8 was counted once


def test_prose_strings_are_normalised_like_the_main_text() -> None:
    from neardup.engine import prose_strings
    from neardup.fingerprint import fingerprint

    main = "市气象台今天发布寒潮蓝色预警。"
    trad = ("市氣象台今天發布寒潮藍色預警。", "其他段落，與正文無關。")
    got = prose_strings(normalise("\n".join(trad)), CFG)
    assert set(fingerprint(normalise(main), CFG).strings) < set(got)
    assert len(got) == 2 and got == tuple(sorted(got))
    assert prose_strings("", CFG) == ()


def test_template_counts_are_bounded_by_two_generations() -> None:
    inner = MemoryKV()
    kv = BufferedKV(inner)
    cfg = CFG.with_overrides(template_window=100, template_min_df=2)
    tf = TemplateFilter(kv, cfg)
    sizes = []
    for page in range(1000):
        tf.filter("h.example.cn", [page * 10 + j for j in range(5)])  # all strings unique
        kv.commit()
        sizes.append(sum(1 for k in inner.data if k.startswith(b"T")))
    # at most two generations of 100 pages x 5 strings, however long the stream ...
    assert max(sizes) <= 2 * 100 * 5
    assert sizes[-1] <= 2 * 100 * 5
    # ... and they are kept, then dropped a generation at a time (not never stored)
    assert max(sizes) > 100 * 5 and sizes[-1] < max(sizes)


def test_a_frequent_string_stays_template_across_generations() -> None:
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG.with_overrides(template_window=100, template_min_df=5))
    hits = []
    for page in range(450):
        template, _ = tf.filter("h.example.cn", [7, 1000 + page])
        kv.commit()
        hits.append(7 in template)
    assert all(hits[5:])


DAY_MS = 86_400_000


def _hosts_kept(kv: MemoryKV) -> int:
    return sum(1 for k in kv.data if k.startswith(b"H"))


def test_hosts_idle_past_the_limit_are_swept_so_the_number_kept_is_bounded() -> None:
    inner = MemoryKV()
    kv = BufferedKV(inner)
    tf = TemplateFilter(kv, CFG.with_overrides(template_idle_days=3))
    kept = []
    for page in range(200):  # 20 new hosts a day, each seen once
        day = page // 20
        tf.filter(f"h{page}.example.cn", [page * 10 + j for j in range(5)], order=day * DAY_MS)
        kv.commit()
        kept.append(_hosts_kept(inner))
    # hosts of the last 4 days (today and 3 idle days) are kept, older ones swept
    assert max(kept) == 80 and kept[-1] == 80
    assert sum(1 for k in inner.data if k.startswith(b"T")) == 80 * 5
    assert tf.hosts_evicted == 120


def test_a_host_idle_past_the_limit_starts_afresh_even_before_it_is_swept() -> None:
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG.with_overrides(template_idle_days=3, template_min_df=3))
    for _ in range(4):
        template, seen = tf.filter("a.example.cn", [1], order=0)
        kv.commit()
    assert template == {1} and seen == 3
    template, seen = tf.filter("a.example.cn", [1], order=3 * DAY_MS)  # 3 idle days: kept
    kv.rollback()
    assert template == {1} and seen == 4
    template, seen = tf.filter("a.example.cn", [1], order=4 * DAY_MS)  # 4: afresh
    kv.commit()
    assert template == set() and seen == 0
    template, seen = tf.filter("a.example.cn", [1], order=4 * DAY_MS)
    assert seen == 1


def test_the_idle_rule_reads_only_the_hosts_own_pages() -> None:
    # what another host does in between changes nothing for this one: a worker that
    # holds some hosts decides like one that holds all of them
    def run(others: int) -> list[set[int]]:
        kv = BufferedKV(MemoryKV())
        tf = TemplateFilter(kv, CFG.with_overrides(template_idle_days=2, template_min_df=2))
        out = []
        for page in range(12):
            template, _ = tf.filter("a.example.cn", [1, 100 + page], order=page * DAY_MS)
            kv.commit()
            out.append(template)
            for j in range(others):
                tf.filter(f"o{page}-{j}.example.cn", [1], order=page * DAY_MS + j)
                kv.commit()
        return out

    assert run(0) == run(5)


def test_dropped_hosts_are_counted_when_their_step_is_committed() -> None:
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG.with_overrides(template_idle_days=1))
    tf.filter("a.example.cn", [1], order=0)
    kv.commit()
    tf.filter("x.example.cn", [1], order=5 * DAY_MS)  # sweeps a host in a step rolled back
    kv.rollback()
    assert tf.hosts_evicted == 0
    tf.filter("x.example.cn", [1], order=5 * DAY_MS)
    kv.commit()
    assert tf.hosts_evicted == 1


def test_a_page_id_is_seen_by_its_host_only() -> None:
    kv = BufferedKV(MemoryKV())
    tf = TemplateFilter(kv, CFG)
    assert not tf.seen("a.example.cn", 42, 0)
    tf.filter("a.example.cn", [1], pid=42, order=0)
    kv.commit()
    assert tf.seen("a.example.cn", 42, 0)
    assert not tf.seen("b.example.cn", 42, 0)
    assert not tf.seen("a.example.cn", 43, 0)


# -- clusters ------------------------------------------------------------------------


def _record(kv: BufferedKV, key: PageKey) -> None:
    import json

    rec = {"page_id": key.page_id, "order": key.order}
    kv.put_many([(b"M" + key.pid.to_bytes(8, "big"), json.dumps(rec).encode())])


def test_union_find_names_the_earliest_and_merges_younger_into_older() -> None:
    kv = BufferedKV(MemoryKV())
    cl = Clusters(kv)
    a, b, c = PageKey(1, 10, "a"), PageKey(2, 20, "b"), PageKey(3, 30, "c")
    for k in (a, b):
        _record(kv, k)
        assert cl.join(k, []) == (k, [])
    _record(kv, c)
    root, merged = cl.join(c, [b.pid, a.pid])
    assert root == a and merged == [b]
    assert {cl.cluster_of(p) for p in (1, 2, 3)} == {"a"}


def test_an_older_page_becomes_the_root() -> None:
    kv = BufferedKV(MemoryKV())
    cl = Clusters(kv)
    young, old = PageKey(5, 50, "young"), PageKey(6, 5, "old")
    _record(kv, young)
    cl.join(young, [])
    _record(kv, old)
    root, merged = cl.join(old, [young.pid])
    assert root == old and merged == [young]
    assert cl.cluster_of(young.pid) == "old"


def test_find_compresses_paths() -> None:
    kv = BufferedKV(MemoryKV())
    cl = Clusters(kv)
    keys = [PageKey(i, i, f"p{i}") for i in range(1, 6)]
    _record(kv, keys[0])
    cl.join(keys[0], [])
    for prev, k in itertools.pairwise(keys):
        _record(kv, k)
        cl.join(k, [prev.pid])
    assert cl.find(5) == 1
    raw = kv.get_many([b"U" + (5).to_bytes(8, "big")])[0]
    assert raw is not None and int.from_bytes(raw, "big") == 1


# -- decide --------------------------------------------------------------------------


# bottom-k sketches estimate well only for hash-like (uniformly spread) values
_POOL = np.random.default_rng(5).choice(2**32, size=2000, replace=False).astype(np.uint32)


def _sketch(values: range) -> tuple[int, bytes]:
    arr = _POOL[list(values)]
    return len(arr), bottom_k(arr, CFG.sketch_size)


def _fps(values: range, strings: tuple[int, ...] = ()) -> Fingerprints:
    n, sketch = _sketch(values)
    return Fingerprints(fp1=0, fp2=0, strings=strings, words=10, shingles=n, sketch=sketch)


def test_verification_decides_the_kind() -> None:
    me = _fps(range(0, 100), strings=(1, 2, 3, 4))
    cands = {
        10: Candidate(10, 2, 2, 0.0, 1, True),  # SimHash neighbour, same 5-grams
        11: Candidate(11, 20, 20, 1.0, 2, False),  # this page is inside a larger one
        12: Candidate(12, 20, 20, 1.0, 3, False),  # a smaller page inside this one
        13: Candidate(13, 20, 20, 1.0, 4, False),  # shares strings, not 5-grams
        14: Candidate(14, 20, 20, 0.2, 5, False, strings=5),  # 5-grams inside, 1 of 5 strings
    }
    sketches = {
        10: _sketch(range(0, 100)),
        11: _sketch(range(0, 300)),
        12: _sketch(range(0, 40)),
        13: _sketch(range(1000, 1100)),
        14: _sketch(range(0, 300)),
    }
    got = {m.pid: m.kind for m in matches(me, cands, sketches, CFG)}
    assert got == {10: Kind.DUPLICATE, 11: Kind.CONTAINED, 12: Kind.CONTAINS}
    best = matches(me, cands, sketches, CFG)[0]
    assert best.pid == 10 and best.distance == 2 and best.similarity == 1.0


def test_candidates_skip_self_and_need_ccs() -> None:
    fps = Fingerprints(fp1=0, fp2=0, strings=(1, 2, 3, 4), words=10)
    near = np.zeros(2, dtype=ENTRY)
    near["pid"] = [7, 8]
    shared = np.zeros(2, dtype=ENTRY)
    shared["pid"], shared["n"] = [9, 10], [4, 4]
    found = Lookup(near=near, shared=shared, shared_counts=np.array([3, 1]))
    got = candidates(fps, found, CFG, self_pid=8)
    assert set(got) == {7, 9}
    assert got[9].ccs == 0.75 and not got[9].by_simhash and got[7].by_simhash


# -- config --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"k1": 4, "k2": 3},
        {"blocks": 3},
        {"blocks": 17},
        {"segmenter": "thulac"},
        {"extractor": "bogus"},
        {"ccs_min": 0.0},
        {"ccs_contain": 5.0},
        {"ccs_contain": -0.1},
        {"jaccard_min": 1.5},
        {"sketch_size": 8},
        {"bucket_cap": 1},
        {"max_bytes": 10},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CFG.with_overrides(**bad)


def test_config_string_and_marker() -> None:
    assert "k1=3" in str(CFG) and "jaccard_min=" in str(CFG)
    assert "jaccard_min" not in CFG.index_marker()  # decision-only: may change between runs
    assert CFG.tables == 4 and CFG.key_bits == 16
    assert CFG.with_overrides(blocks=6).tables == 20
