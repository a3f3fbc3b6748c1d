"""Features and fingerprints of a normalised text.

* primary: 64-bit SimHash of consecutive word pairs weighted by term frequency;
* secondary: 64-bit SimHash of keyword windows (tf-idf, part of speech, length and
  first position choose the keywords; synonyms folded);
* period feature strings: the ``period_len`` characters before each 。, hashed.

The stored index depends on these values: ``tests/unit/test_fingerprint.py`` pins them.

The parts are in modules of their own: ``neardup.simhash`` (hashing and SimHash),
``neardup.words`` (segmentation, word pairs and keyword windows), ``neardup.sketch``
(period strings, 5-grams, sketches and resemblance) and ``neardup.tables`` (the lexicon
and character classes, cached on disk). This module holds the ``Fingerprints`` record,
the native module's wiring and the two ways of computing fingerprints.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

import numpy as np

from neardup import facts
from neardup.config import EngineConfig
from neardup.facts import facts_of
from neardup.lexicon import STOPWORDS, SYNONYMS
from neardup.simhash import _distinct, _hashes, hash64, simhash_weighted
from neardup.sketch import (
    _PERIOD,
    SHINGLE_CHARS,
    period_strings,
    piece_features,
    piece_owners,
    sketch_of,
)
from neardup.tables import _lexicon, char_classes
from neardup.words import _vocabulary, content_words, keywords, pair_features, window_features


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """What the index stores and the decision compares."""

    fp1: int
    fp2: int
    strings: tuple[int, ...]  # sorted, distinct hashes of period feature strings
    words: int  # number of content words (after stopwords)
    shingles: int = 0  # number of distinct character 5-grams
    sketch: bytes = b""  # bottom-k sketch of those 5-grams: sorted little-endian uint32
    #: Per sentence piece (text up to a period): its period string's hash, 0 for none
    #: (uint64), and its number of letters, digits and ideographs (uint32); and every
    #: 5-gram's hash (uint32), in text order. A 5-gram belongs to the piece it starts in.
    #: Only carried to the template filter, which rebuilds the sketch without template
    #: sentences; never stored in the index.
    piece_strings: bytes = b""
    shingle_hashes: bytes = b""
    piece_chars: bytes = b""
    #: The text's numbers (``neardup.facts``): sorted distinct hashes (uint32), kept in
    #: the index beside the sketch; and every run of digits as (piece, hash) pairs, which
    #: only the template filter reads, to leave out the numbers of template sentences.
    facts: bytes = b""
    piece_facts: bytes = b""

    def without(self, template: set[int], sketch_size: int, whole: int = 0) -> Fingerprints:
        """These fingerprints with the template sentences' strings and 5-grams left out
        (the sketch as ``sketch_of`` makes it). Without the per-piece data (a record from
        before it existed) only strings go."""
        if not self.piece_strings:
            kept_strings = tuple(s for s in self.strings if s not in template)
            return (
                self
                if len(kept_strings) == len(self.strings)
                else replace(self, strings=kept_strings)
            )
        strings = np.frombuffer(self.piece_strings, dtype="<u8")
        drop = np.isin(strings, np.fromiter(template, dtype=np.uint64, count=len(template)))
        if not drop.any():
            return self
        hashes = np.frombuffer(self.shingle_hashes, dtype="<u4")
        kept = np.unique(hashes[~drop[piece_owners(self.piece_chars, len(hashes))]])
        return replace(
            self,
            strings=tuple(s for s in self.strings if s not in template),
            shingles=len(kept),
            sketch=sketch_of(kept, sketch_size, whole),
            facts=facts_of(self.piece_facts, drop) if self.piece_facts else self.facts,
        )


def period_hashes(text: str, length: int) -> list[int]:
    """The sorted, distinct ``hash64`` of the period strings of ``text``."""
    fast = native()
    if fast is not None:
        try:
            return fast.period_hashes(text, length)
        except UnicodeEncodeError:  # a lone surrogate: hash64 takes it, Rust's str does not
            pass
    return sorted({hash64(s) for s in period_strings(text, length)})


class Native(Protocol):
    """What ``neardup._native.Fingerprinter`` offers the engine."""

    def fingerprint(  # noqa: PLR0917 (the Rust signature: positional, one call site)
        self, text: str, keywords: int, window: int, period_len: int, shingle_chars: int,
        sketch_size: int,
    ) -> tuple[int, int, list[int], int, int, bytes, bytes, bytes, bytes]: ...  # fmt: skip

    def period_hashes(self, text: str, period_len: int) -> list[int]: ...


#: The ``neardup._native.FORMAT`` this module was written against: a module built from
#: other sources (an old build left installed) computes what those sources did.
NATIVE_FORMAT = 1


@lru_cache(maxsize=1)
def native() -> Native | None:
    """The native fingerprinter (``native/``, built into the package as ``neardup._native``
    where Rust was found at install time: hatch_build.py), or None when it is not there,
    is of another format (with a warning), or ``NEARDUP_NATIVE=0``. Immutable once made,
    as the tables it is made from."""
    if os.environ.get("NEARDUP_NATIVE", "1") == "0":
        return None
    try:
        from neardup._native import FORMAT, Fingerprinter
    except ImportError:
        # pip hides a build hook's output, so this is where a user learns it is missing.
        warnings.warn(
            "neardup was installed without its native module (no Rust toolchain when it "
            "was built): fingerprints are computed in Python, the same values for about "
            "three times the fingerprint stage's CPU; reinstall with cargo on PATH to build "
            "it, or set NEARDUP_NATIVE=0 to choose the Python path without this warning",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if FORMAT != NATIVE_FORMAT:
        warnings.warn(
            f"neardup._native is of format {FORMAT}, this neardup needs {NATIVE_FORMAT}: "
            "fingerprints are computed in Python (reinstall neardup to rebuild it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    keys, weights, median_idf = _lexicon()
    made: Native = Fingerprinter(
        sorted(STOPWORDS),
        dict(SYNONYMS),
        keys.astype("<u8").tobytes(),
        weights.astype("<f8").tobytes(),
        median_idf,
        char_classes(),
    )
    return made


def fingerprint(text: str, cfg: EngineConfig) -> Fingerprints:
    """Both SimHashes of ``text``, its period strings and its 5-gram sketch.

    With rjieba as the segmenter, the native module computes them when it is installed:
    the same values (``tests/unit/test_native.py``) for a third of the CPU. A lone
    surrogate, which is not UTF-8, raises UnicodeEncodeError either way, as rjieba does
    (decode has replaced them before any page gets here)."""
    fast = native() if cfg.segmenter == "rjieba" else None
    if fast is None:
        return fingerprint_python(text, cfg)
    fp1, fp2, strings, words, shingles, sketch, *blobs = fast.fingerprint(
        text, cfg.keywords, cfg.window, cfg.period_len, SHINGLE_CHARS, cfg.sketch_size
    )
    if cfg.sketch_size < shingles <= cfg.exact_shingles:  # whole: see sketch_of
        sketch = np.unique(np.frombuffer(blobs[1], dtype="<u4")).astype("<u4").tobytes()
    pairs = text_facts(text)
    piece_strings, shingle_hashes, piece_chars = blobs
    return Fingerprints(
        fp1, fp2, tuple(strings), words, shingles, sketch, piece_strings, shingle_hashes,
        piece_chars, facts_of(pairs), pairs,
    )  # fmt: skip


def text_facts(text: str) -> bytes:
    """``neardup.facts.text_facts`` of ``text`` cut at its periods, as ``piece_features``
    cuts it (the piece indices are those of ``Fingerprints.piece_chars``)."""
    return facts.text_facts(text, _PERIOD)


def fingerprint_python(text: str, cfg: EngineConfig) -> Fingerprints:
    """``fingerprint`` in Python and numpy: the reference the native module matches."""
    words = content_words(text, cfg)
    vocab, ids, first = _vocabulary(words)
    vocab_hashes = _hashes(vocab)
    fp1 = simhash_weighted(*pair_features(vocab_hashes[ids]))
    # keyword windows work on synonym-folded words: fold the vocabulary, then regroup
    folded = [i for i, w in enumerate(vocab) if w in SYNONYMS]
    if folded:
        canon = vocab.copy()
        for i in folded:
            canon[i] = SYNONYMS[canon[i]]
        canon_vocab, canon_of, rep = _vocabulary(canon)
        # a folded word's group is known by its first member: its hash, its first position
        canon_hashes = vocab_hashes[rep]
        is_folded = np.zeros(len(vocab), dtype=bool)
        is_folded[folded] = True
        renamed = is_folded[rep].nonzero()[0]
        canon_hashes[renamed] = _hashes([canon_vocab[j] for j in renamed.tolist()])
        canon_ids, canon_first = canon_of[ids], first[rep]
    else:
        canon_vocab, canon_hashes, canon_ids, canon_first = vocab, vocab_hashes, ids, first
    tf = np.bincount(canon_ids, minlength=len(canon_vocab))
    chosen = keywords(canon_vocab, canon_hashes, tf, canon_first, cfg.keywords)
    fp2 = simhash_weighted(*window_features(canon_hashes, canon_ids, chosen, cfg.window))
    piece_strings, hashes, piece_chars = piece_features(text, cfg.period_len)
    shingles = _distinct(hashes, counts=False)[0]
    pairs = text_facts(text)
    return Fingerprints(
        fp1=fp1,
        fp2=fp2,
        strings=tuple(sorted({int(x) for x in piece_strings if x})),
        words=len(words),
        shingles=len(shingles),
        sketch=sketch_of(shingles, cfg.sketch_size, cfg.exact_shingles),
        piece_strings=piece_strings.astype("<u8").tobytes(),
        shingle_hashes=hashes.astype("<u4").tobytes(),
        piece_chars=piece_chars.astype("<u4").tobytes(),
        facts=facts_of(pairs),
        piece_facts=pairs,
    )
