"""Immutable tables derived from files that ship with the dependencies, kept on disk
between runs: the keyword lexicon (from jieba's dictionaries) and the character classes
the native module reads.

Separate because it is the one place that reads and writes the cache directory
(``cache_dir``); deriving these costs a process start about half a second of CPU, loading
them about 15 ms. Only pure functions of shipped files go there, never decision state.
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
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from neardup.simhash import U64, _hashes

# Parts of speech (jieba tags) that make a keyword: nouns, names, verbs, verbal nouns.
_KEYWORD_POS = frozenset({"n", "nr", "nrt", "nrfg", "ns", "nt", "nz", "v", "vn", "eng", "j", "l"})


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
