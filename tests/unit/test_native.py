"""The native fingerprinter (``native/``) against the Python path: the same values, always.

Skipped where ``neardup._native`` was not built (neardup installed without Rust), except
where ``NEARDUP_EXPECT_NATIVE=1`` (CI): there a missing module fails the run, so the fast
path is the one tested.
"""

from __future__ import annotations

import os

import mmh3
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neardup import fingerprint as fpmod
from neardup.config import EngineConfig
from neardup.fingerprint import fingerprint, fingerprint_python, native
from neardup.lexicon import STOPWORDS, SYNONYMS
from neardup.normalise import normalise
from neardup.simhash import hash64
from neardup.sketch import period_strings, piece_features
from neardup.tables import char_classes
from tests.corpus import ARTICLES, HARD_A, HARD_B

CFG = EngineConfig()

if native() is None:
    if os.environ.get("NEARDUP_EXPECT_NATIVE") == "1":
        raise RuntimeError(
            "NEARDUP_EXPECT_NATIVE=1 but neardup._native is not built (installing neardup "
            "builds it where cargo is on PATH: scripts/setup.sh)"
        )
    pytest.skip("neardup._native is not built, or NEARDUP_NATIVE=0", allow_module_level=True)

NATIVE = native()

# Text that exercises every rule: ideographs, the synonyms and stopwords, periods of
# both kinds, Latin full stops after letters, digits and underscores, white space of
# several kinds, astral ideographs, combining marks, superscript and circled digits.
_PIECES = [
    *"。!?.,_ \n\t\u3000\u00a0",
    *("²", "①", "١", "e\u0301", "\U00020000", "\U0001f600"),
    *list(SYNONYMS)[:40],
    *sorted(STOPWORDS)[:40],
    *("地铁", "线路", "开通", "运营", "市民", "12", "3.5", "abc", "Mr.", "U.S.", "x_y"),
]
texts = st.lists(st.sampled_from(_PIECES) | st.text(max_size=4), max_size=120).map("".join)
configs = st.builds(
    EngineConfig,
    keywords=st.integers(1, 40),
    window=st.integers(1, 4),
    period_len=st.integers(1, 12),
    sketch_size=st.integers(16, 160),
)


def _both(text: str, cfg: EngineConfig = CFG) -> tuple[fpmod.Fingerprints, fpmod.Fingerprints]:
    return fingerprint(text, cfg), fingerprint_python(text, cfg)


def test_the_native_path_is_the_one_taken() -> None:
    # a fingerprint the native module made: its values, through the module's own call
    text = normalise("\n".join(ARTICLES["rail"]))
    raw = NATIVE.fingerprint(text, CFG.keywords, CFG.window, CFG.period_len, 5, CFG.sketch_size)  # type: ignore[attr-defined]
    fps = fingerprint(text, CFG)
    assert (raw[0], raw[1]) == (fps.fp1, fps.fp2)


@pytest.mark.parametrize("name", sorted(ARTICLES))
def test_the_corpus_fingerprints_the_same_both_ways(name: str) -> None:
    text = normalise("\n".join(ARTICLES[name]))
    native_fp, python_fp = _both(text)
    assert native_fp == python_fp
    assert native_fp.words > 10  # a real article, not an empty match


def test_the_hard_pair_and_the_prose_fingerprint_the_same_both_ways() -> None:
    for paragraphs in (HARD_A, HARD_B):
        text = normalise("\n".join(paragraphs))
        assert _both(text)[0] == _both(text)[1]


@settings(max_examples=400, deadline=None)
@given(texts)
@example("")
@example("。。!")
@example("Mr. Smith arrived. 3. 5.")
@example("近日，市民表示：地铁开通了。")
@example("a_b。c²d①e")
def test_any_text_fingerprints_the_same_both_ways(text: str) -> None:
    native_fp, python_fp = _both(text)
    assert native_fp == python_fp


@settings(max_examples=100, deadline=None)
@given(texts, configs)
def test_any_parameters_give_the_same_both_ways(text: str, cfg: EngineConfig) -> None:
    assert fingerprint(text, cfg) == fingerprint_python(text, cfg)


def test_period_len_zero_takes_the_whole_piece_as_python_slicing_does() -> None:
    # EngineConfig refuses 0; the native call follows Python's c[-0:] all the same
    text = "第一句话很长。第二句。"
    raw = NATIVE.fingerprint(text, 24, 2, 0, 5, 128)  # type: ignore[attr-defined]
    strings, _, _ = piece_features(text, 0)
    assert raw[6] == strings.astype("<u8").tobytes()


def test_a_module_of_another_format_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from neardup import _native

    monkeypatch.setattr(_native, "FORMAT", fpmod.NATIVE_FORMAT + 1)
    fpmod.native.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="format"):
            assert fpmod.native() is None
    finally:
        monkeypatch.undo()
        fpmod.native.cache_clear()
    assert fpmod.native() is not None


def test_a_lone_surrogate_is_refused_both_ways() -> None:
    # not UTF-8: rjieba refuses it, and so does the native module (decode replaces them)
    text = "近日，市民表示\ud800地铁开通了。"
    for path in (fingerprint, fingerprint_python):
        with pytest.raises(UnicodeEncodeError):
            path(text, CFG)


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(1, 12))
@example("近日\ud800，市民表示。地铁开通了。", 10)  # a lone surrogate: the Python way
def test_period_hashes_are_the_hashed_period_strings(text: str, length: int) -> None:
    expected = sorted({hash64(s) for s in period_strings(text, length)})
    assert fpmod.period_hashes(text, length) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_murmur64_is_mmh3_hash64(data: bytes) -> None:
    expected = mmh3.hash64(data, seed=0, x64arch=True, signed=False)[0]
    assert NATIVE.murmur64(data) == expected  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(texts)
def test_segmentation_is_rjiebas(text: str) -> None:
    import rjieba

    assert NATIVE.cut(text) == rjieba.cut(text)  # type: ignore[attr-defined]


def test_character_classes_are_pythons() -> None:
    classes = char_classes()
    assert len(classes) == 0x110000

    def bits(ch: str) -> int:
        return classes[ord(ch)]

    assert bits("_") == 1  # \w, not alnum
    assert bits("中") == 3 and bits("\U00020000") == 3
    assert bits("5") == 1 | 2 | 4 | 16
    assert bits("²") == 1 | 2 | 16  # a digit, not a decimal one
    assert bits("\u3000") == 8 and bits("\n") == 8 and bits("。") == 0
    # and every code point as the str predicates see it (re's \\w is isalnum or "_",
    # \\d is isdecimal, \\s is isspace: the classes come from the regexes themselves)
    every = [chr(c) for c in range(0x110000)]
    for bit, predicate in (
        (1, lambda ch: ch.isalnum() or ch == "_"),
        (2, str.isalnum),
        (4, str.isdecimal),
        (8, str.isspace),
        (16, str.isdigit),
    ):
        wrong = [ch for ch in every if bool(classes[ord(ch)] & bit) != predicate(ch)]
        assert not wrong, (bit, [hex(ord(ch)) for ch in wrong[:5]])
