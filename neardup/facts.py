"""The facts of a text: its numbers, which tell a light edit from a formulaic text.

A reprint lightly edited keeps its dates, times, amounts and counts (an edit may slip one
digit); announcements told in the same stock sentences differ in exactly those. Their
5-gram resemblance cannot tell the two apart, since both sit at about 0.6 to 0.8; their
numbers can. A page's facts are the hashes of its runs of digits (after normalisation,
full-width digits are ASCII), as a sorted set of at most ``FACTS_MAX`` (the smallest, as
a bottom-k sketch keeps, so two capped sets still compare on a common range).

The verification reads the other page's facts from what the index keeps of it, beside its
5-gram sketch: ``with_facts`` packs them after the sketch and ``split_facts`` reads them
back (a sketch stored without them reads as one without facts).
"""

from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass

import mmh3
import numpy as np
import numpy.typing as npt

#: At most this many facts a page: a long text's numbers are compared on their smallest
#: hashes, as its 5-grams are on their bottom-k sketch.
FACTS_MAX = 64
_DIGITS = re.compile(r"\d+")
#: The trailer after the facts: their number in the low 16 bits, ``_TAG`` above. A sketch
#: is sorted and its hashes spread over 32 bits, so its last one is a tag by chance with
#: odds of about 2^-26, and then only if the count below it fits too.
_TRAILER = struct.Struct("<I")
_TAG = 0xFAC70000


def text_facts(text: str, periods: re.Pattern[str]) -> bytes:
    """Every run of digits of ``text``, in text order: pairs of uint32, the index of the
    piece it is in (the text cut at ``periods``, as ``neardup.fingerprint`` cuts it) and
    the run's hash. The template filter drops the pieces it knows."""
    runs = [(m.start(), m.group()) for m in _DIGITS.finditer(text)]
    if not runs:
        return b""
    ends = [m.end() for m in periods.finditer(text)]
    pairs = [(bisect.bisect_right(ends, at), mmh3.hash(run, 0, False)) for at, run in runs]
    return np.array(pairs, dtype="<u4").tobytes()


def facts_of(pairs: bytes, drop: npt.NDArray[np.bool_] | None = None) -> bytes:
    """The sorted distinct fact hashes of ``text_facts``' pairs, at most ``FACTS_MAX``,
    less those in pieces marked in ``drop`` (one flag a piece)."""
    table = np.frombuffer(pairs, dtype="<u4").reshape(-1, 2)
    if drop is not None and len(table):
        table = table[~drop[np.minimum(table[:, 0], len(drop) - 1)]]
    return np.unique(table[:, 1])[:FACTS_MAX].astype("<u4").tobytes()


def with_facts(sketch: bytes, facts: bytes) -> bytes:
    """The sketch with the page's facts after it, as the index keeps them (a page without
    numbers keeps its bare sketch)."""
    if not facts:
        return sketch
    return sketch + facts + _TRAILER.pack(_TAG | (len(facts) // 4))


def split_facts(blob: bytes) -> tuple[bytes, bytes]:
    """The sketch and the facts of what ``with_facts`` made; a bare sketch (stored
    without facts) comes back whole, with no facts."""
    if len(blob) >= _TRAILER.size:
        (trailer,) = _TRAILER.unpack_from(blob, len(blob) - _TRAILER.size)
        count = trailer & 0xFFFF
        if trailer & 0xFFFF0000 == _TAG and count <= FACTS_MAX:
            end = len(blob) - _TRAILER.size
            start = end - 4 * count
            if start >= 0 and start % 4 == 0:
                return blob[:start], blob[start:end]
    return blob, b""


@dataclass(frozen=True, slots=True)
class Agreement:
    """How two pages' numbers compare: those in both, and those only in each."""

    shared: int
    only_mine: int
    only_theirs: int

    def differ(self, least: int, share: float) -> bool:
        """Whether the facts disagree: each page has at least ``least`` numbers the other
        lacks, and those are at least ``share`` of all the numbers of the two. Two copies
        lightly edited apart have slipped a digit each at most; a formula's copies have
        other dates, amounts and counts."""
        only = self.only_mine + self.only_theirs
        every = only + self.shared
        return min(self.only_mine, self.only_theirs) >= least and only >= share * every

    def agree(self, least: int, smaller_is_mine: bool | None = None, *, part: bool = False) -> bool:
        """Whether the facts bear the pages out: at least ``least`` numbers in both, and
        few only in one page.

        For resemblance (``smaller_is_mine`` None): either page has at most one number
        the other lacks (a slipped digit), under half as many as they share; or, in a
        text rich in numbers, where an edit slips one here and there, the two pages' lone
        numbers together are at most half as many as they share. For containment, the
        smaller page's lone numbers: when it is a clear ``part`` of the other (an
        excerpt), under half as many as the shared ones; when the two are of a size, at
        most one and under half as many, or few in both pages as for resemblance."""
        if self.shared < least:
            return False
        if smaller_is_mine is not None:
            lone = self.only_mine if smaller_is_mine else self.only_theirs
            if part:
                return 2 * lone < self.shared
            return (lone <= 1 and 2 * lone < self.shared) or self.agree(least)
        lone = max(self.only_mine, self.only_theirs)
        slipped = lone <= 1 and 2 * lone < self.shared
        return slipped or 2 * (self.only_mine + self.only_theirs) <= self.shared


def compare(mine: bytes, theirs: bytes) -> Agreement:
    """Compare two pages' facts (``facts_of``). When either set is capped at
    ``FACTS_MAX``, only hashes below the smaller of the two sets' largest count."""
    if not mine or not theirs:
        return Agreement(0, len(mine) // 4, len(theirs) // 4)
    a = np.frombuffer(mine, dtype="<u4").tolist()
    b = np.frombuffer(theirs, dtype="<u4").tolist()
    if len(a) >= FACTS_MAX or len(b) >= FACTS_MAX:
        top = min(a[-1], b[-1])
        a, b = [x for x in a if x <= top], [x for x in b if x <= top]
    shared = len(set(a).intersection(b))
    return Agreement(shared, len(a) - shared, len(b) - shared)
