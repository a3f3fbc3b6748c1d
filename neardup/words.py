"""Word features of the two SimHashes: the text segmented into content words, their
consecutive pairs (primary), and the windows around the best keywords (secondary).

Separate from ``neardup.fingerprint``, which assembles them, because this is where the
segmenter and the keyword score live; the keyword weights come from ``neardup.tables``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from neardup.config import EngineConfig
from neardup.lexicon import STOPWORDS
from neardup.simhash import U64, _distinct, combine
from neardup.tables import lexicon_weights

# Word tokens: anything with a letter, digit or ideograph in it; punctuation goes.
_WORDLIKE = re.compile(r"\w")


@lru_cache(maxsize=2)
def segmenter(name: str) -> Callable[[str], list[str]]:
    """The word segmenter named in the config. Both share jieba's dictionary."""
    if name == "rjieba":
        import rjieba

        return lambda text: list(rjieba.cut(text))
    import jieba

    jieba.setLogLevel(60)
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    lcut: Callable[[str], list[str]] = tokenizer.lcut
    return lcut


def content_words(text: str, cfg: EngineConfig) -> list[str]:
    """Segmented words of ``text`` without punctuation, spaces and stopwords."""
    words = segmenter(cfg.segmenter)(text)
    # isalnum() is true for most words (ideographs count) and much cheaper than the regex
    return [w for w in words if w not in STOPWORDS and (w.isalnum() or _WORDLIKE.search(w))]


def pair_features(hashes: U64) -> tuple[U64, npt.NDArray[np.int64]]:
    """Distinct consecutive word pairs (shingles of two words) and their counts."""
    return _distinct(combine(hashes[:-1], hashes[1:]))


def keywords(
    vocab: Sequence[str],
    hashes: U64,
    tf: npt.NDArray[np.int64],
    first: npt.NDArray[np.int64],
    count: int,
) -> npt.NDArray[np.int64]:
    """Indices into ``vocab`` of the ``count`` best keywords (``hashes``: their hash64).

    Score: tf-idf, boosted for an early first position and for longer words; only content
    parts of speech (or words unknown to the dictionary, which are often names) qualify.
    Ties go to the word that comes first in ``vocab``.
    """
    idfs = lexicon_weights(hashes)
    lengths = np.fromiter(map(len, vocab), dtype=np.float64, count=len(vocab))
    digits = np.fromiter(map(str.isdigit, vocab), dtype=bool, count=len(vocab))
    idfs[(lengths < 2) | digits] = -1.0
    n = max(int(tf.sum()), 1)
    score = tf * idfs * (1.5 - 0.5 * first / n) * (0.8 + 0.1 * np.minimum(lengths, 5))
    score[idfs < 0] = -1.0
    best = np.argsort(-score, kind="stable")[:count]
    return best[score[best] > 0]


def _vocabulary(
    words: Sequence[str],
) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Distinct words in order of first occurrence, each position's index into them, and
    each distinct word's first position."""
    index: dict[str, int] = {}
    ids = np.array([index.setdefault(w, len(index)) for w in words], dtype=np.int64)
    return list(index), ids, _first_positions(ids)


def _first_positions(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each id first occurs, for ids numbered in order of first occurrence (a new
    id is one greater than every id before it)."""
    new = np.empty(len(ids), dtype=bool)
    if len(ids):
        top = np.maximum.accumulate(ids)
        new[0] = True
        np.not_equal(top[1:], top[:-1], out=new[1:])
    return new.nonzero()[0]


def window_features(
    canon_hashes: U64, ids: npt.NDArray[np.int64], chosen: npt.NDArray[np.int64], window: int
) -> tuple[U64, npt.NDArray[np.int64]]:
    """Distinct (keyword, neighbour) pairs for the ``window`` words either side of each
    occurrence of a ``chosen`` word, with their counts. ``ids`` is the text as indices
    into the (synonym-folded) vocabulary whose hashes are ``canon_hashes``."""
    if len(ids) == 0 or len(chosen) == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    hashes = canon_hashes[ids]
    is_chosen = np.zeros(len(canon_hashes), dtype=bool)
    is_chosen[chosen] = True
    at = is_chosen[ids].nonzero()[0]
    # every (occurrence, offset) pair at once; the order does not matter to the counts
    offsets = np.arange(-window, window + 1)
    nb = at[:, None] + offsets[offsets != 0]
    ok = (nb >= 0) & (nb < len(ids))
    src = np.repeat(at, 2 * window)[ok.ravel()]
    return _distinct(combine(hashes[src], hashes[nb[ok]]))
