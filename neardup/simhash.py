"""Hashing and SimHash: the 64-bit hash of a feature, the hash of an ordered pair, and
Charikar's SimHash over weighted hashes, with the Hamming distance that compares two.

Kept apart from the features they hash (``neardup.words``) because other stages use them
alone: the template filter and the analysis keys hash with ``hash64``, the baselines in
``bench/`` with ``simhash``. The stored index depends on these values
(``tests/unit/test_fingerprint.py`` pins them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

import mmh3
import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
_T = TypeVar("_T", bound=np.generic)


def hash64(feature: str) -> int:
    """Unsigned 64-bit MurmurHash3 (x64_128, seed 0, first half) of a UTF-8 string."""
    # bytes, not str: mmh3 5.3 crashes the process on a lone surrogate; same values
    data = feature.encode("utf-8", "surrogatepass")
    return int(mmh3.hash64(data, seed=0, x64arch=True, signed=False)[0])


def _mix(x: U64) -> U64:
    """SplitMix64's finaliser, elementwise; uint64 arithmetic wraps by design."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def combine(a: U64, b: U64) -> U64:
    """Hash of the ordered pair (a, b) of word hashes."""
    return _mix(a ^ _mix(b + np.uint64(0x9E3779B97F4A7C15)))


def simhash_weighted(hashes: U64, weights: npt.NDArray[np.float64] | npt.NDArray[np.int64]) -> int:
    """Charikar's SimHash: bit i is set when the weighted vote of the hashes' bit i is positive."""
    if len(hashes) == 0:
        return 0
    bits = np.unpackbits(
        hashes.astype("<u8").view(np.uint8).reshape(-1, 8), axis=1, bitorder="little"
    )
    w = np.asarray(weights)
    if w.dtype.kind in "iu":
        # Integer weights (counts): vote = 2 * (weight of the hashes with the bit set) -
        # total weight, exact in float64 below 2**53, without a +-1 copy of the bit matrix.
        votes = 2.0 * (w.astype(np.float64) @ bits) - float(w.sum())
    else:
        votes = w.astype(np.float64) @ (2.0 * bits - 1.0)
    return int(np.packbits(votes > 0, bitorder="little").view("<u8")[0])


def simhash(features: Counter[str]) -> int:
    """SimHash of string features weighted by their counts (used by the baselines)."""
    hashes = np.fromiter((hash64(f) for f in features), dtype=np.uint64, count=len(features))
    return simhash_weighted(
        hashes, np.fromiter(features.values(), dtype=np.float64, count=len(features))
    )


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def _distinct(
    values: npt.NDArray[_T], counts: bool = True
) -> tuple[npt.NDArray[_T], npt.NDArray[np.int64]]:
    """``np.unique(values, return_counts=counts)``: sorted distinct values and how often
    each occurs (empty when not asked for), with less overhead on small arrays."""
    s = np.sort(values)
    new = np.empty(len(s), dtype=bool)
    new[:1] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    if not counts:
        return s[new], np.empty(0, dtype=np.int64)
    starts = new.nonzero()[0]
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1:] = len(s)
    return s[starts], ends - starts


def _hashes(words: Sequence[str]) -> U64:
    """``hash64`` of each word, as an array. mmh3's defaults (seed 0, x64, signed) are
    the same bits as ``hash64``, and a call without keywords costs half as much."""
    h = mmh3.hash64
    return np.fromiter((h(w)[0] for w in words), dtype=np.int64, count=len(words)).view(np.uint64)
