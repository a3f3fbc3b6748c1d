"""Features and fingerprints of a normalised text.

* primary: 64-bit SimHash of consecutive word pairs weighted by term frequency;
* secondary: 64-bit SimHash of keyword windows (tf-idf, part of speech, length and
  first position choose the keywords; synonyms folded);
* period feature strings: the ``period_len`` characters before each 。, hashed.

The stored index depends on these values: ``tests/unit/test_fingerprint.py`` pins them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import re
import sys
import tempfile
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Protocol, TypeVar

import mmh3
import numpy as np
import numpy.typing as npt

from neardup import facts
from neardup.config import EngineConfig
from neardup.facts import facts_of
from neardup.lexicon import STOPWORDS, SYNONYMS

U64 = npt.NDArray[np.uint64]
_T = TypeVar("_T", bound=np.generic)
# Word tokens: anything with a letter, digit or ideograph in it; punctuation goes.
_WORDLIKE = re.compile(r"\w")
# Period feature strings and shingles ignore everything but letters, digits and ideographs.
_NOT_CONTENT = re.compile(r"[\W_]")
# Periods: 。 ! ? and a full stop after a letter before white space. Written to start with
# one character class (the full stop's conditions checked after it), which lets the regex
# engine skip ahead to candidates: seven times faster than "[。!?]|(?<=[^\W\d_])\.(?=\s|$)",
# which matches the same characters.
_PERIOD = re.compile(r"[。!?.](?:(?<=[。!?])|(?<=[^\W\d_]\.)(?=\s|$))")
# Parts of speech (jieba tags) that make a keyword: nouns, names, verbs, verbal nouns.
_KEYWORD_POS = frozenset({"n", "nr", "nrt", "nrfg", "ns", "nt", "nz", "v", "vn", "eng", "j", "l"})


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


#: Characters per shingle of the verification sketch.
SHINGLE_CHARS = 5


def piece_owners(piece_chars: bytes, shingles: int) -> npt.NDArray[np.intp]:
    """The index of the piece each of the first ``shingles`` 5-grams starts in, from the
    pieces' lengths (``Fingerprints.piece_chars``)."""
    lengths = np.frombuffer(piece_chars, dtype="<u4")
    return np.repeat(np.arange(len(lengths)), lengths)[:shingles]


def piece_chars_from_owners(owners: npt.NDArray[np.uint32], pieces: int) -> bytes:
    """``piece_chars`` that give these owners back (``piece_owners``), from the per-5-gram
    piece indices that messages written before ``piece_chars`` carried. The counts are
    the pieces' lengths except in the last few characters, where no 5-gram starts."""
    return np.bincount(owners, minlength=pieces).astype("<u4").tobytes()


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


def period_strings(text: str, length: int) -> list[str]:
    """The ``length`` characters before each period (or the text since the previous period
    if shorter), counting only letters, digits and ideographs. Periods are 。, ! and ?
    (normalisation has folded their full-width forms) and, for text in Latin script, a
    full stop after a letter and before white space."""
    pieces = _PERIOD.split(text)
    return [c[-length:] for piece in pieces[:-1] if (c := _NOT_CONTENT.sub("", piece))]


def period_hashes(text: str, length: int) -> list[int]:
    """The sorted, distinct ``hash64`` of the period strings of ``text``."""
    fast = native()
    if fast is not None:
        try:
            return fast.period_hashes(text, length)
        except UnicodeEncodeError:  # a lone surrogate: hash64 takes it, Rust's str does not
            pass
    return sorted({hash64(s) for s in period_strings(text, length)})


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


#: Bump whenever the lexicon's derivation (``_build_lexicon``) changes: it keys the copy
#: kept on disk, beside the contents of jieba's tables and the parts of speech.
_LEXICON_FORMAT = 1
_LEXICON_FILES = (os.path.join("analyse", "idf.txt"), "dict.txt")


@lru_cache(maxsize=1)
def _lexicon() -> tuple[U64, npt.NDArray[np.float64], float]:
    """Keyword weight of words, by ``hash64`` of the word: sorted distinct hashes and each
    one's weight, the word's IDF or -1 where its part of speech rules it out; and the
    median IDF for unknown words. From the tables that ship with jieba (immutable once
    loaded).

    Deriving it costs about 0.5 s of CPU, in every process that starts (each ``neardup``
    run, each sandbox zygote), so the arrays are kept in the cache directory
    (``cache_dir``), keyed by a hash of the tables' bytes: loading them costs about 15 ms.
    A copy that is missing, unreadable or malformed is derived again."""
    root = _jieba_root()
    tables = []
    for name in _LEXICON_FILES:
        with open(os.path.join(root, name), "rb") as fh:
            tables.append(fh.read())
    key = hashlib.sha256(f"{_LEXICON_FORMAT} {sorted(_KEYWORD_POS)}".encode())
    for table in tables:
        key.update(table)
    directory = cache_dir()
    path = directory / f"lexicon-{key.hexdigest()[:32]}.npz" if directory else None
    if path is not None:
        cached = _load_lexicon(path)
        if cached is not None:
            return cached
    idf, words = (table.decode("utf-8") for table in tables)
    lexicon = _build_lexicon(idf, words)
    if path is not None:
        _save_lexicon(path, lexicon)
    return lexicon


def cache_dir() -> Path | None:
    """Where derived, immutable tables are kept between runs: ``NEARDUP_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/neardup`` (if absolute), else ``~/.cache/neardup``; None (no cache)
    when ``NEARDUP_CACHE_DIR`` is set empty or there is no home. Only a pure function of
    files that ship with the dependencies goes there, never decision state."""
    explicit = os.environ.get("NEARDUP_CACHE_DIR")
    if explicit is not None:
        return Path(explicit) if explicit else None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative path is invalid, ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    # No home to expand (no HOME, a uid without a passwd entry): "~" stays as it is, and a
    # relative path would put a cache in whatever the working directory is. None then.
    return Path(base) / "neardup" if os.path.isabs(base) else None


def _jieba_root() -> str:
    # Located, not imported: importing jieba.analyse loads jieba's HMM tables (0.5 s of
    # CPU in every sandbox zygote) that rjieba never uses.
    spec = importlib.util.find_spec("jieba")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("jieba's dictionary files are needed (pip install jieba)")
    return os.path.dirname(spec.origin)


def _build_lexicon(idf_table: str, dict_table: str) -> tuple[U64, npt.NDArray[np.float64], float]:
    """``_lexicon`` from the texts of jieba's ``idf.txt`` and ``dict.txt``."""
    # Whole-file splits: a line loop over 620,000 lines costs three times as much.
    idf_words, idf_values = _columns(idf_table, 2, (0, 1))
    words, tags = _columns(dict_table, 3, (0, 2))
    not_content = [w for w, t in zip(words, tags, strict=True) if t not in _KEYWORD_POS]
    idf = np.fromiter(map(float, idf_values), dtype=np.float64, count=len(idf_values))
    idf_keys, idf = _last_wins(_hashes(idf_words), idf)
    median_idf = float(np.median(idf))
    # Keyed by hash, not by word: a lookup into a dict of 290,000 words misses the cache
    # two or three times (0.7 us a word, a sixth of fingerprinting); a vectorised binary
    # search over the hashes the page has computed anyway costs a tenth of that. Distinct
    # jieba words do not collide in 64 bits (tests/unit/test_fingerprint.py checks), and
    # a word outside the dictionary hits one of its hashes with odds of 2^-46.
    keys, weights = _last_wins(
        np.concatenate([idf_keys, _hashes(not_content)]),
        np.concatenate([idf, np.full(len(not_content), -1.0)]),
    )
    return keys, weights, median_idf


def _load_lexicon(path: Path) -> tuple[U64, npt.NDArray[np.float64], float] | None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys, weights, median = npz["keys"], npz["weights"], npz["median"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    ok = (
        keys.dtype == np.uint64
        and weights.dtype == np.float64
        and median.dtype == np.float64
        and keys.ndim == 1
        and keys.shape == weights.shape
        and median.shape == ()
        and len(keys) > 0
        and bool((keys[1:] > keys[:-1]).all())  # sorted and distinct, as lookups need
    )
    return (keys, weights, float(median)) if ok else None


def _save_lexicon(path: Path, lexicon: tuple[U64, npt.NDArray[np.float64], float]) -> None:
    """Write the copy atomically (a reader never sees half of one); a cache that cannot
    be written (a read-only home, a full disk) only costs the next run the derivation."""
    keys, weights, median = lexicon
    buffer = io.BytesIO()
    np.savez(buffer, keys=keys, weights=weights, median=np.float64(median))
    _save_atomically(path, buffer.getvalue())


def _save_atomically(path: Path, data: bytes) -> None:
    """Write a cached copy whole or not at all (a reader never sees half of one); a cache
    that cannot be written (a read-only home, a full disk) only costs the next run the
    derivation."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


#: Leading bits of a word's hash that index the lexicon's table of runs (``_runs``).
_RUN_BITS = 18


@lru_cache(maxsize=1)
def _runs() -> npt.NDArray[np.uint32]:
    """Where in the lexicon's sorted keys each value of their leading ``_RUN_BITS`` bits
    begins (one more entry for the end): 1 MiB, about one key a run."""
    keys = _lexicon()[0]
    top = keys >> np.uint64(64 - _RUN_BITS)
    values = np.arange((1 << _RUN_BITS) + 1, dtype=np.uint64)
    return np.searchsorted(top, values).astype(np.uint32)


def lexicon_weights(hashes: U64) -> npt.NDArray[np.float64]:
    """The keyword weight (``_lexicon``) of each word hash: its IDF, -1 where its part of
    speech rules it out, the median IDF where the dictionaries do not have it.

    The hash's leading bits find its run of keys (``_runs``), and the run's few keys are
    compared one rank at a time, for all hashes at once: two or three cache misses a
    word, where a binary search over the 290,000 keys takes about a dozen (the tables
    are out of cache by the time a page gets here). 0.29 against 0.18 ms a page in a
    micro-benchmark that evicts the caches between pages."""
    keys, weights, median_idf = _lexicon()
    runs = _runs()
    top = (hashes >> np.uint64(64 - _RUN_BITS)).astype(np.intp)
    at, end = runs[top].astype(np.intp), runs[top + 1].astype(np.intp)
    out = np.full(len(hashes), median_idf)
    todo = np.arange(len(hashes))
    while len(todo):
        live = at[todo] < end[todo]
        todo = todo[live]
        hit = keys[at[todo]] == hashes[todo]
        out[todo[hit]] = weights[at[todo[hit]]]
        todo = todo[~hit]
        at[todo] += 1
    return out


def _last_wins(keys: U64, values: npt.NDArray[np.float64]) -> tuple[U64, npt.NDArray[np.float64]]:
    """Sorted distinct keys, each with the value of its last occurrence (dict semantics)."""
    distinct, at = np.unique(keys[::-1], return_index=True)
    return distinct, values[::-1][at]


def _columns(text: str, width: int, keep: tuple[int, int]) -> tuple[list[str], list[str]]:
    """Two columns of a table of lines of ``width`` fields split at white space; lines of
    another width are left out (the tables that ship with jieba have none)."""
    tokens = text.split()
    lines = text.splitlines()
    if len(tokens) != width * len(lines):
        rows = [parts for line in lines if len(parts := line.split()) == width]
        tokens = [t for parts in rows for t in parts]
    return tokens[keep[0] :: width], tokens[keep[1] :: width]


def content_words(text: str, cfg: EngineConfig) -> list[str]:
    """Segmented words of ``text`` without punctuation, spaces and stopwords."""
    words = segmenter(cfg.segmenter)(text)
    # isalnum() is true for most words (ideographs count) and much cheaper than the regex
    return [w for w in words if w not in STOPWORDS and (w.isalnum() or _WORDLIKE.search(w))]


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


def _hashes(words: Sequence[str]) -> U64:
    """``hash64`` of each word, as an array. mmh3's defaults (seed 0, x64, signed) are
    the same bits as ``hash64``, and a call without keywords costs half as much."""
    h = mmh3.hash64
    return np.fromiter((h(w)[0] for w in words), dtype=np.int64, count=len(words)).view(np.uint64)


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


def piece_features(
    text: str, length: int, n: int = SHINGLE_CHARS
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """Cut ``text`` at its periods. Returns each piece's period-string hash (0 for the last
    piece and empty ones), the hashes of the character ``n``-grams of the text's letters,
    digits and ideographs (a text shorter than ``n`` is one shingle), and each piece's
    number of those characters."""
    contents = [_NOT_CONTENT.sub("", p) for p in _PERIOD.split(text)]
    last = len(contents) - 1
    h64 = mmh3.hash64  # hash64's bits, signed (see _hashes)
    strings = np.fromiter(
        (h64(c[-length:])[0] if c and i < last else 0 for i, c in enumerate(contents)),
        dtype=np.int64,
        count=len(contents),
    ).view(np.uint64)
    codes = np.frombuffer("".join(contents).encode("utf-32-le"), dtype=np.uint32)
    lengths = np.fromiter(map(len, contents), dtype=np.uint32, count=len(contents))
    if len(codes) == 0:
        return strings, np.empty(0, dtype=np.uint32), lengths
    n = min(n, len(codes))
    windows = len(codes) - n + 1
    wide = codes.astype(np.uint64)
    h = wide[:windows].copy()
    for i in range(1, n):
        h *= np.uint64(0x100000001B3)
        h += wide[i : windows + i]
    return strings, (_mix(h) >> np.uint64(32)).astype(np.uint32), lengths


def char_shingles(text: str, n: int = SHINGLE_CHARS) -> npt.NDArray[np.uint32]:
    """Distinct hashes of the character ``n``-grams of ``text`` (see ``piece_features``)."""
    return np.unique(piece_features(text, 1, n)[1])


def bottom_k(hashes: npt.NDArray[np.uint32], k: int) -> bytes:
    """The ``k`` smallest of distinct ``hashes`` (sorted), as bytes."""
    return np.sort(hashes)[:k].astype("<u4").tobytes()


def sketch_of(shingles: npt.NDArray[np.uint32], k: int, whole: int) -> bytes:
    """The verification sketch of distinct ``shingles``: all of them, sorted, when there
    are at most ``whole``, else the ``k`` smallest. Two whole sets compare exactly
    (``resemblance``); the sketch's prefix of ``k`` is the bottom-k sketch either way."""
    return bottom_k(shingles, len(shingles) if len(shingles) <= whole else k)


def resemblance(a: bytes, n_a: int, b: bytes, n_b: int, k: int) -> tuple[float, float]:
    """Estimated Jaccard resemblance of two shingle sets from their bottom-k sketches, and
    the estimated containment of the smaller set in the larger. Exact when both sketches
    are whole sets (as many hashes as shingles: ``sketch_of``)."""
    sa, sb = np.frombuffer(a, dtype="<u4"), np.frombuffer(b, dtype="<u4")
    if len(sa) == 0 or len(sb) == 0:
        return 0.0, 0.0
    # One sort of both sketches: a hash in both stands twice in a row. The sorted union
    # is the first of each run; its first k say how many of the k smallest are shared.
    # (np.union1d, intersect1d and isin gave the same at six times the cost.)
    merged = np.concatenate((sa, sb))
    merged.sort()
    first = np.empty(len(merged), dtype=bool)
    first[0] = True
    np.not_equal(merged[1:], merged[:-1], out=first[1:])
    if len(sa) == n_a and len(sb) == n_b:
        both = len(merged) - int(np.count_nonzero(first))
        return both / (n_a + n_b - both), both / min(n_a, n_b)
    shared = np.zeros(len(merged), dtype=bool)
    np.logical_not(first[1:], out=shared[:-1])
    smallest = shared[first][:k]
    jac = float(np.count_nonzero(smallest)) / len(smallest)
    inter = jac * (n_a + n_b) / (1.0 + jac)
    return jac, min(1.0, inter / max(1, min(n_a, n_b)))


#: Bump whenever ``char_classes``'s derivation changes: it keys the copy kept on disk.
_CLASSES_FORMAT = 1
#: Bits of ``char_classes``, as the native module reads them.
_WORD, _ALNUM, _DECIMAL, _SPACE, _DIGIT = 1, 2, 4, 8, 16


def char_classes() -> bytes:
    """One byte a code point (all 0x110000): whether it matches re's ``\\w`` (1), is
    ``str.isalnum`` (2), matches ``\\d`` (4) or ``\\s`` (8), or is ``str.isdigit`` (16).

    Made from the very regexes and predicates of the Python path, so the native path
    classifies every character as this Python does, whatever Unicode version Rust's
    tables have. Deriving it costs about 0.13 s of CPU, so a copy is kept in the cache
    directory (``cache_dir``) keyed by this Python's exact build, which fixes its Unicode
    database and its regex engine; a copy whose checksum fails is derived again."""
    directory = cache_dir()
    key = hashlib.sha256(f"{_CLASSES_FORMAT} {sys.version}".encode()).hexdigest()[:32]
    path = directory / f"chars-{key}.bin" if directory else None
    if path is not None:
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            table, digest = data[:-32], data[-32:]
            if len(table) == 0x110000 and hashlib.sha256(table).digest() == digest:
                return table
    table = _derive_char_classes()
    if path is not None:
        _save_atomically(path, table + hashlib.sha256(table).digest())
    return table


def _derive_char_classes() -> bytes:
    # every code point in order, lone surrogates too (a sixth of the time of a join)
    every = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    classes = np.zeros(0x110000, dtype=np.uint8)
    for pattern, bit in (
        (r"\w+", _WORD), (r"[^\W_]+", _ALNUM), (r"\d+", _DECIMAL), (r"\s+", _SPACE)
    ):  # fmt: skip
        for m in re.finditer(pattern, every):
            classes[m.start() : m.end()] |= bit
    # isdigit has no regex: it is decimal digits plus superscripts, circled digits and
    # the like, all of which have a numeric value; only those are asked.
    numeric = np.flatnonzero(classes & _ALNUM)
    digits = [c for c in numeric.tolist() if chr(c).isdigit()]
    classes[digits] |= _DIGIT
    return classes.tobytes()


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
