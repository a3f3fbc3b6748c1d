"""Fingerprints: golden values (the stored index depends on them) and SimHash properties."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup.config import EngineConfig
from neardup.fingerprint import fingerprint
from neardup.normalise import normalise
from neardup.simhash import combine, hamming, hash64, simhash_weighted
from neardup.sketch import (
    bottom_k,
    period_strings,
    piece_features,
    piece_owners,
    resemblance,
)
from neardup.words import content_words
from tests.corpus import ARTICLES, HARD_A, HARD_B, in_a_process

CFG = EngineConfig()
#: Sketches only, never whole sets: the pinned bottom-k sketch.
NO_WHOLE = CFG.with_overrides(exact_shingles=0)


def fp_of(paragraphs: list[str], cfg: EngineConfig = CFG) -> tuple[int, int]:
    text = normalise("\n".join(paragraphs))
    f = fingerprint(text, cfg)
    return f.fp1, f.fp2


# Changing any of these changes every stored index: bump store.FORMAT_VERSION with them.
GOLDEN = {
    "hash64": 0xF4BA3C34F50C75AD,
    "rail": (0xA69A78E5724B25FB, 0x22A3A0BE5013717A),
}


@pytest.fixture(params=["native", "python"])
def fingerprint_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The golden values hold for both ways of computing fingerprints (``native/``)."""
    import neardup.fingerprint

    if request.param == "python":
        monkeypatch.setattr(neardup.fingerprint, "native", lambda: None)
    elif neardup.fingerprint.native() is None:
        pytest.skip("neardup._native is not built, or NEARDUP_NATIVE=0")
    return str(request.param)


def test_hash64_is_murmur3_x64_first_half() -> None:
    assert hash64("近日") == GOLDEN["hash64"]


def test_golden_fingerprints(fingerprint_path: str) -> None:
    assert fp_of(ARTICLES["rail"]) == GOLDEN["rail"]


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()[:16]


def test_golden_period_strings_sketch_and_index_keys(fingerprint_path: str) -> None:
    # what the index stores beside the SimHash: the period-string postings, the 5-gram
    # sketch, the bucket and posting keys and a bucket's entry layout
    from neardup.fingerprint import Fingerprints
    from neardup.index import KVIndex, make_entry
    from neardup.store import MemoryKV

    f = fingerprint(normalise("\n".join(ARTICLES["rail"])), CFG)
    assert (len(f.strings), f.strings[0], f.words, f.shingles) == (7, 0x26BE0766B58D2967, 115, 274)
    assert _digest(np.array(f.strings, dtype="<u8").tobytes()) == "62b5ca7d873c8dbf"
    # 274 5-grams, fewer than exact_shingles: the whole set is kept, and its prefix is
    # the bottom-k sketch a longer text keeps
    assert len(f.sketch) == 4 * f.shingles and _digest(f.sketch) == "15beff84bf1fa56e"
    bottom = fingerprint(normalise("\n".join(ARTICLES["rail"])), NO_WHOLE).sketch
    assert len(bottom) == 4 * CFG.sketch_size and _digest(bottom) == "b7ace727a14e538f"
    assert f.sketch[: len(bottom)] == bottom
    index = KVIndex(MemoryKV(), CFG)
    sim, strings = index.keys(f)
    # a short page: its 7 period strings, then its 8 smallest 5-gram hashes
    assert (len(sim), len(strings)) == (8, 7 + CFG.minhash_keys)
    assert sim[0] == b"P\x00\xa6\x9a" + bytes(6)  # primary, table 0: the first 16 bits
    assert _digest(b"".join(sim + strings[:7])) == "3c66f214023ee49e"
    assert strings[7:] == [b"B" + f.sketch[i : i + 4][::-1] for i in range(0, 32, 4)]
    assert strings[7] == b"B\x00 \xeb\x9f"
    assert _digest(index.sketch_value(f)) == "881e463b2237c603"
    entry = make_entry(0x0102030405060708, Fingerprints(*GOLDEN["rail"], (1, 2, 3), 5), 1 << 40)
    assert entry.tobytes().hex() == (
        "0807060504030201fb254b72e5789aa67a711350bea0a322000000000001000003000000"
    )


def test_segmenters_agree_closely() -> None:
    a = fp_of(ARTICLES["library"], CFG)
    b = fp_of(ARTICLES["library"], CFG.with_overrides(segmenter="jieba"))
    assert hamming(a[0], b[0]) <= 3


def test_simhash_matches_the_definition() -> None:
    hashes = np.array([1, 2, 3, 0xFFFFFFFFFFFFFFFF, 0x8000000000000000], dtype=np.uint64)
    weights = np.array([1.0, 1.0, 1.0, 2.0, 0.5])
    expected = 0
    for bit in range(64):
        vote = sum(w if (int(h) >> bit) & 1 else -w for h, w in zip(hashes, weights, strict=True))
        expected |= (vote > 0) << bit
    assert simhash_weighted(hashes, weights) == expected


def test_combine_is_ordered() -> None:
    a, b = np.array([hash64("甲")], dtype=np.uint64), np.array([hash64("乙")], dtype=np.uint64)
    assert combine(a, b)[0] != combine(b, a)[0]


def test_period_strings() -> None:
    text = "第一句话很长很长很长很长。短句。。最后没有句号"
    assert period_strings(text, 6) == ["很长很长很长", "短句"]
    assert period_strings("a, b。", 10) == ["ab"]
    assert period_strings("Prices rose 3.5 percent. Then fell! Why? ok", 6) == [
        "ercent",
        "enfell",
        "Why",
    ]
    assert period_strings(normalise("感叹！疑问？"), 10) == ["感叹", "疑问"]


def test_stopwords_and_punctuation_are_dropped() -> None:
    words = content_words("我们的城市，在今天！", CFG)
    assert "的" not in words and "," not in words and "城市" in words


def test_script_and_width_variants_fingerprint_alike() -> None:
    simp = ARTICLES["museum"]
    import opencc

    trad = [opencc.OpenCC("s2t").convert(p) for p in simp]
    # punctuation and letters in the other width: identical after normalisation
    wide = [p.replace("，", ",").replace("。", "｡") + "ＶＲ２０２６" for p in simp]
    narrow = [p + "VR2026" for p in simp]
    base = fp_of(simp)
    assert hamming(base[0], fp_of(trad)[0]) <= 3
    assert fp_of(wide) == fp_of(narrow)


def test_different_articles_are_far_apart() -> None:
    fps = {name: fp_of(paras)[0] for name, paras in ARTICLES.items()}
    names = sorted(fps)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert hamming(fps[a], fps[b]) > 12, (a, b)
    assert hamming(fp_of(HARD_A)[0], fp_of(HARD_B)[0]) > 6


# A news-length text (about 1,100 characters): SimHash distances of small edits only
# stay small when the edit is a small share of the features.
LONG = ARTICLES["rail"] + ARTICLES["harvest"] + ARTICLES["heatwave"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(LONG) - 1), st.integers(0, 40), st.sampled_from("的了是在和与及新旧大小"))
def test_one_character_edit_gives_a_small_distance(para: int, pos: int, char: str) -> None:
    paras = list(LONG)
    p = paras[para]
    pos = min(pos, len(p) - 1)
    paras[para] = p[:pos] + char + p[pos + 1 :]
    a, b = fp_of(LONG), fp_of(paras)
    # unrelated texts sit near 32; one edit moves a few of ~350 features
    assert hamming(a[0], b[0]) <= 12


def test_one_character_edits_move_few_bits_on_average() -> None:
    import random
    import statistics

    rng = random.Random(7)
    base = fp_of(LONG)[0]
    distances = []
    for _ in range(150):
        paras = list(LONG)
        i = rng.randrange(len(paras))
        j = rng.randrange(len(paras[i]))
        paras[i] = paras[i][:j] + rng.choice("的了是在和与及新旧大小") + paras[i][j + 1 :]
        distances.append(hamming(base, fp_of(paras)[0]))
    assert statistics.median(distances) <= 4
    assert max(distances) <= 12


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_distance_is_a_metric_on_bits(a: int, b: int) -> None:
    assert hamming(a, a) == 0
    assert hamming(a, b) == hamming(b, a)
    assert 0 <= hamming(a, b) <= 64


def test_fingerprints_do_not_depend_on_the_hash_seed() -> None:
    # Python salts str hashes per process: a fingerprint that followed the iteration order
    # of a set or dict of words would differ from one process to the next.
    code = (
        "import json; from tests.unit.test_fingerprint import ARTICLES, fp_of; "
        "print(json.dumps({k: fp_of(v) for k, v in sorted(ARTICLES.items())}))"
    )
    here = {k: list(fp_of(v)) for k, v in sorted(ARTICLES.items())}
    for seed in (0, 4242):
        assert json.loads(in_a_process(code, hash_seed=seed)) == here


def test_without_template_rebuilds_strings_and_sketch() -> None:
    from neardup.sketch import bottom_k, char_shingles

    body = "".join(ARTICLES["rail"])
    footer = "本网站所有内容均受版权保护未经授权不得转载。"
    f = fingerprint(normalise(body + footer), CFG)
    template = {hash64(period_strings(footer, CFG.period_len)[0])}
    assert template <= set(f.strings)
    g = f.without(template, CFG.sketch_size)
    assert not template & set(g.strings)
    assert g.shingles < f.shingles
    # the footer's 5-grams (those starting in its sentence) are gone, the body's stay
    plain = fingerprint(normalise(body), CFG)
    assert set(plain.strings) == set(g.strings)
    assert g.sketch != f.sketch
    assert bottom_k(char_shingles(normalise(body)), CFG.sketch_size)[:40] == plain.sketch[:40]
    assert f.without(set(), CFG.sketch_size) is f


def test_golden_facts_and_their_place_beside_the_sketch(fingerprint_path: str) -> None:
    """A page's numbers (``neardup.facts``): the same on both paths, pinned, kept after
    the sketch in the index and read back from there; a page without numbers keeps its
    bare sketch."""
    from neardup.facts import compare, split_facts
    from neardup.index import KVIndex

    text = normalise("2026年3月18日，全区46个站点完成检修，储备12万吨，约30万户受益。")
    f = fingerprint(text, CFG)
    facts = np.frombuffer(f.facts, dtype="<u4")
    assert len(facts) == 6 and bool((facts[1:] > facts[:-1]).all())
    assert _digest(f.facts) == "ea8b75a8adc4e5c5"
    stored = KVIndex.sketch_value(f)[4:]
    assert split_facts(stored) == (f.sketch, f.facts)
    assert compare(f.facts, split_facts(stored)[1]).shared == 6
    rail = fingerprint(normalise("\n".join(ARTICLES["rail"])), CFG)
    assert rail.facts == b"" and split_facts(rail.sketch) == (rail.sketch, b"")


def test_facts_leave_out_template_sentences() -> None:
    """A footer's hotline is no fact of the article: the template filter drops its
    numbers with its 5-grams, so that two sites' footers do not set copies apart."""
    body = "城西水厂于3月18日通水试运行，日供水能力提高到25万吨。"
    footer = "举报电话12377，经营许可证编号2026001。"
    f = fingerprint(normalise(body + footer), CFG)
    template = {hash64(period_strings(footer, CFG.period_len)[0])}
    g = f.without(template, CFG.sketch_size, CFG.exact_shingles)
    assert len(f.facts) == 4 * 5 and g.facts == fingerprint(normalise(body), CFG).facts


def test_facts_compare_capped_sets_on_their_common_range() -> None:
    from neardup.facts import FACTS_MAX, compare, facts_of

    def pairs(values: range) -> bytes:
        runs = np.array([(0, v) for v in values], dtype="<u4")
        return runs.tobytes()

    many = facts_of(pairs(range(1000, 1000 + 4 * FACTS_MAX, 2)))  # capped: the smallest
    few = facts_of(pairs(range(1000, 1010)))
    assert len(many) == 4 * FACTS_MAX
    got = compare(few, many)
    assert (got.shared, got.only_mine) == (5, 5)  # 1000..1008 even in both, odd in few
    assert got.only_theirs == 0  # many's hashes above few's largest are not compared


def test_lexicon_by_hash_is_the_dictionary_by_word() -> None:
    """The keyword weights are looked up by hash64: every word of jieba's tables must get
    exactly the weight a lookup by word gives (no two of its words collide in 64 bits)."""
    import importlib.util
    import os

    from neardup.simhash import _hashes
    from neardup.tables import _KEYWORD_POS, _lexicon

    spec = importlib.util.find_spec("jieba")
    assert spec is not None and spec.origin is not None
    root = os.path.dirname(spec.origin)
    by_word: dict[str, float] = {}
    with open(os.path.join(root, "analyse", "idf.txt"), encoding="utf-8") as fh:
        for line in fh:
            word, _, value = line.rstrip().partition(" ")
            by_word[word] = float(value)
    median = float(np.median(list(by_word.values())))
    with open(os.path.join(root, "dict.txt"), encoding="utf-8") as fh:
        for line in fh:
            word, _, tag = line.split()
            if tag not in _KEYWORD_POS:
                by_word[word] = -1.0
    keys, weights, median_idf = _lexicon()
    assert median_idf == median
    assert len(keys) == len(by_word)  # a collision would merge two words into one key
    words = list(by_word)
    at = np.searchsorted(keys, _hashes(words))
    assert (keys[at] == _hashes(words)).all()
    assert weights[at].tolist() == list(by_word.values())
    # the lookup the keywords use: the same weights, and the median for other words
    from neardup.tables import lexicon_weights

    assert lexicon_weights(_hashes(words)).tolist() == list(by_word.values())
    others = [f"{w}呀呀" for w in words[:5000]] + ["", "neardup", "语"]
    others = [w for w in others if w not in by_word]
    assert (lexicon_weights(_hashes(others)) == median).all()
    assert lexicon_weights(_hashes([])).tolist() == []


def _same_lexicon(
    a: tuple[np.ndarray, np.ndarray, float], b: tuple[np.ndarray, np.ndarray, float]
) -> bool:
    return bool((a[0] == b[0]).all() and (a[1] == b[1]).all() and a[2] == b[2])


def test_lexicon_cache_round_trip_and_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lexicon kept on disk is the one derived from jieba's tables; a missing or
    damaged copy is derived again and rewritten; no cache directory means no file."""
    from neardup import tables as fp

    root = fp._jieba_root()
    tables = [Path(root, name).read_text(encoding="utf-8") for name in fp._LEXICON_FILES]
    built = fp._build_lexicon(*tables)
    monkeypatch.setenv("NEARDUP_CACHE_DIR", str(tmp_path / "cache"))
    fp._lexicon.cache_clear()
    try:
        assert _same_lexicon(fp._lexicon(), built)  # derived, then written
        (copy,) = (tmp_path / "cache").glob("lexicon-*.npz")
        fp._lexicon.cache_clear()
        with monkeypatch.context() as m:
            m.setattr(fp, "_build_lexicon", lambda *tables: pytest.fail("derived, not loaded"))
            assert _same_lexicon(fp._lexicon(), built)  # loaded from the copy
        for damage in (copy.read_bytes()[:1000], b"not an npz"):
            copy.write_bytes(damage)
            fp._lexicon.cache_clear()
            assert _same_lexicon(fp._lexicon(), built)
            reloaded = fp._load_lexicon(copy)  # rewritten whole
            assert reloaded is not None and _same_lexicon(reloaded, built)
        # unsorted keys are refused, not used
        np.savez(copy, keys=built[0][::-1].copy(), weights=built[1], median=np.float64(built[2]))
        assert fp._load_lexicon(copy) is None
        monkeypatch.setenv("NEARDUP_CACHE_DIR", "")
        assert fp.cache_dir() is None
        fp._lexicon.cache_clear()
        copy.unlink()
        assert _same_lexicon(fp._lexicon(), built)
        assert not copy.exists()
        # a cache that cannot be written costs only the derivation
        blocker = tmp_path / "file"
        blocker.write_text("x")
        monkeypatch.setenv("NEARDUP_CACHE_DIR", str(blocker / "cache"))
        fp._lexicon.cache_clear()
        assert _same_lexicon(fp._lexicon(), built)
    finally:
        fp._lexicon.cache_clear()


def test_char_classes_cache_round_trip_and_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The character classes kept on disk are the derived ones; a damaged copy (cut
    short, or a byte changed: the checksum) is derived again and rewritten; a cache that
    cannot be written costs only the derivation."""
    from neardup import tables as fp

    derived = fp._derive_char_classes()
    monkeypatch.setenv("NEARDUP_CACHE_DIR", str(tmp_path / "cache"))
    assert fp.char_classes() == derived  # derived, then written
    (copy,) = (tmp_path / "cache").glob("chars-*.bin")
    with monkeypatch.context() as m:
        m.setattr(fp, "_derive_char_classes", lambda: pytest.fail("derived, not loaded"))
        assert fp.char_classes() == derived  # loaded from the copy
    whole = copy.read_bytes()
    changed = bytearray(whole)
    changed[ord("中")] ^= 1
    for damage in (whole[:1000], bytes(changed), b""):
        copy.write_bytes(damage)
        assert fp.char_classes() == derived
        assert copy.read_bytes() == whole  # rewritten whole
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("NEARDUP_CACHE_DIR", str(blocker / "cache"))
    assert fp.char_classes() == derived


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from neardup.tables import cache_dir

    monkeypatch.delenv("NEARDUP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert cache_dir() == Path("/x/cache/neardup")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert cache_dir() == Path("/home/u/.cache/neardup")
    monkeypatch.setenv("NEARDUP_CACHE_DIR", "/srv/neardup")
    assert cache_dir() == Path("/srv/neardup")
    monkeypatch.delenv("NEARDUP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid: ignored
    assert cache_dir() == Path("/home/u/.cache/neardup")
    monkeypatch.setattr("os.path.expanduser", lambda path: path)  # no home to expand
    assert cache_dir() is None


_PIECE_TEXT = st.text(alphabet="近日铁路。!?. ab1,\n", max_size=60)


@settings(max_examples=300, deadline=None)
@given(text=_PIECE_TEXT)
def test_piece_lengths_give_each_5_gram_the_piece_it_starts_in(text: str) -> None:
    strings, hashes, chars = piece_features(text, CFG.period_len)
    assert len(chars) == len(strings)
    # by hand: the content characters of each piece, and where each 5-gram starts
    owner_of_char = [i for i, n in enumerate(chars.tolist()) for _ in range(n)]
    expected = owner_of_char[: len(hashes)]
    owners = piece_owners(chars.astype("<u4").tobytes(), len(hashes))
    assert owners.tolist() == expected


_SKETCH = st.lists(st.integers(0, 2**32 - 1), max_size=40, unique=True)


def _sketch(hashes: list[int]) -> bytes:
    return np.array(sorted(hashes), dtype="<u4").tobytes()


@given(_SKETCH, _SKETCH, st.integers(1, 48), st.integers(0, 500), st.integers(0, 500))
def test_resemblance_matches_its_definition(
    a: list[int], b: list[int], k: int, n_a: int, n_b: int
) -> None:
    # Broder's estimate: of the k smallest hashes of the union, the share in both sketches
    jac, cont = resemblance(_sketch(a), n_a, _sketch(b), n_b, k)
    if not a or not b:
        assert (jac, cont) == (0.0, 0.0)
        return
    if len(a) == n_a and len(b) == n_b:  # two whole sets: exact, whatever k
        both = len(set(a) & set(b))
        assert jac == both / len(set(a) | set(b))
        assert cont == both / min(n_a, n_b)
        return
    smallest = sorted(set(a) | set(b))[:k]
    want = sum(x in set(a) and x in set(b) for x in smallest) / len(smallest)
    assert jac == want
    inter = want * (n_a + n_b) / (1.0 + want)
    assert cont == min(1.0, inter / max(1, min(n_a, n_b)))


@given(_SKETCH, _SKETCH, st.integers(1, 48))
def test_resemblance_is_exact_for_sets_the_sketches_hold_whole(
    a: list[int], b: list[int], k: int
) -> None:
    """Whole sets (``sketch_of``), of any size against ``k``: the estimates are the set
    measures themselves, Jaccard |A∩B| / |A∪B| and containment |A∩B| / min(|A|, |B|),
    worked out here from the sets (not from the estimator's formula)."""
    if not a or not b:
        return
    sa, sb = set(a), set(b)
    jac, cont = resemblance(_sketch(a), len(a), _sketch(b), len(b), k)
    assert jac == len(sa & sb) / len(sa | sb)
    assert cont == pytest.approx(len(sa & sb) / min(len(sa), len(sb)), abs=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_resemblance_estimates_large_sets_within_their_error(seed: int) -> None:
    """Sets larger than the sketch: an excerpt B of 1,000 shingles of a page A of 3,000
    (true Jaccard 1/3, containment 1), and a page C of 3,000 that shares 500 of A's
    (Jaccard 1/11, containment 1/6). With k = 256 the Jaccard estimate's standard error
    is about 0.029 and 0.018, its containment's about 0.066 and 0.030 (the estimator's
    slope times those); the bounds are four of them."""
    rng = np.random.default_rng(seed)
    pool = rng.choice(2**32, size=6000, replace=False).astype(np.uint32)
    a, b = pool[:3000], pool[:1000]
    c = np.concatenate((pool[:500], pool[3000:5500]))
    k = 256
    sketch = {name: bottom_k(s, k) for name, s in (("a", a), ("b", b), ("c", c))}
    jac, cont = resemblance(sketch["a"], 3000, sketch["b"], 1000, k)
    assert abs(jac - 1 / 3) < 0.12 and cont > 1 - 0.27
    jac, cont = resemblance(sketch["a"], 3000, sketch["c"], 3000, k)
    assert abs(jac - 1 / 11) < 0.072 and abs(cont - 1 / 6) < 0.12
