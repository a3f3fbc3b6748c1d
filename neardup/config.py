"""Engine parameters: validated once, printed into every decision and the index marker."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

#: Parameters that change what is written to the index. Opening an index whose marker
#: disagrees on any of these is refused; the others may change between runs.
INDEX_PARAMS = (
    "segmenter",
    "period_len",
    "blocks",
    "k1",
    "window",
    "keywords",
    "sketch_size",
)
#: Main-text extractors (``neardup.extract``). ``fast`` is an alias of ``density``, the
#: name configurations used before ``density`` had its own.
EXTRACTORS = ("density", "fast", "resiliparse", "trafilatura")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything that decides a page. Ranges are checked in ``__post_init__``."""

    #: Main-text extractor, one of ``EXTRACTORS``.
    extractor: str = "density"
    #: Word segmenter: "rjieba" (jieba-rs, same dictionary) or "jieba".
    segmenter: str = "rjieba"
    #: Hamming radius for a plain duplicate (D1 <= k1), and the looser radius that
    #: needs the secondary fingerprint to agree (k1 < D1 <= k2 and D2 <= k1).
    k1: int = 3
    k2: int = 6
    #: The 64 bits are cut into this many blocks; every choice of ``blocks - k1``
    #: blocks is one table, so C(blocks, k1) tables. 4 blocks, k1 = 3: 4 tables of 16 bits.
    blocks: int = 4
    #: Keywords for the secondary fingerprint, and words taken either side of each.
    keywords: int = 24
    window: int = 2
    #: Characters before each 。 that make a period feature string.
    period_len: int = 10
    #: Containment candidates: share of the smaller page's strings found in the other
    #: page (CCS), and the least number of shared strings.
    ccs_min: float = 0.5
    ccs_min_shared: int = 1
    #: Every candidate is verified on character 5-grams, estimated from bottom-k sketches
    #: of ``sketch_size`` hashes: a duplicate needs resemblance >= ``jaccard_min`` (or
    #: >= ``jaccard_simhash`` when the SimHash rule holds); containment needs the smaller
    #: page's 5-grams to be >= ``containment_min`` inside the larger.
    sketch_size: int = 128
    #: A page with at most this many distinct 5-grams keeps all of them instead of a
    #: sketch, and two such pages are compared exactly: on short texts the sketch's error
    #: (about 0.04) is as wide as the gap between a light edit and a formulaic text. A
    #: whole set is known by its length, so stored values read right under any setting.
    exact_shingles: int = 640
    #: Such a short page is also posted under its ``minhash_keys`` smallest 5-gram
    #: hashes, and an earlier short page sharing ``minhash_shared`` of them is verified:
    #: a light edit can change every sentence ending of a short text (``neardup.index``).
    minhash_keys: int = 8
    minhash_shared: int = 2
    jaccard_min: float = 0.72
    #: ... the resemblance asked of a SimHash candidate. The SimHash covers the whole text,
    #: template sentences too, so its agreement says nothing of the article: the same as
    #: ``jaccard_min`` by default, which makes a match rest on the article's 5-grams.
    jaccard_simhash: float = 0.72
    containment_min: float = 0.85
    #: ... and containment also needs this share of the smaller page's period strings in
    #: the other page: formulaic texts share 5-grams but differ in sentence endings.
    ccs_contain: float = 0.7
    #: ... short of that share by at most ``ccs_slack`` strings: with a few sentences,
    #: 0.7 means all of them, and a light edit near one sentence end changes its string.
    ccs_slack: int = 1
    #: The pages' numbers (``neardup.facts``) decide near the cuts. Two pages each with at
    #: least ``facts_differ`` numbers the other lacks, those ``facts_differ_share`` or more
    #: of the two pages' numbers, do not match under resemblance ``jaccard_sure`` (the
    #: same stock sentences with other dates and counts). Pages sharing at least
    #: ``facts_agree`` numbers, with at most one, and under half as many, only in either
    #: (a slipped digit), or with half as many or fewer only in the two together (a text
    #: rich in numbers, an edit slipping one here and there), are duplicates from
    #: resemblance ``jaccard_facts`` on; when the smaller, a clear part of the other, has
    #: under half as many numbers the other lacks as they share, it is contained from
    #: containment ``containment_facts`` on (an excerpt lightly edited).
    facts_differ: int = 2
    facts_differ_share: float = 0.7
    jaccard_sure: float = 0.85
    facts_agree: int = 2
    jaccard_facts: float = 0.65
    containment_facts: float = 0.78
    #: A page with at most this share of the other's 5-grams is `contained`, not `duplicate`.
    contain_ratio: float = 0.8
    #: A page contained in an earlier page and in a later one joins them both when it is
    #: at least this share of the later page (an excerpt published first); a smaller one
    #: is text that unrelated pages share and may not bridge them (``Engine``).
    excerpt_share: float = 0.5
    #: ... or when the later page shares with another page of that cluster at least this
    #: much more of its 5-grams than the contained page makes up (a full copy edited
    #: apart from the first full copy).
    excerpt_margin: float = 0.15
    #: Learned template filter: a period string seen in at least ``template_min_df``
    #: earlier pages of the same host, and in at least ``template_frac`` of them, is dropped.
    template_min_df: int = 8
    template_frac: float = 0.002
    #: ... and a whole main-text line (``neardup.engine.block_key``) seen on at least
    #: ``template_block_min_df`` earlier pages of the host, and on at least
    #: ``template_block_frac`` of them, is dropped; when the main text was nothing else,
    #: the runner-up block is the text. The share tells a template's block (on most of
    #: a host's pages) from a story the host carries twice or three times (a duplicate).
    template_block_min_df: int = 2
    template_block_frac: float = 0.3
    #: Template counts cover a host's last ``template_window`` to ``2 * template_window``
    #: pages; older counts are deleted, which bounds the state per host.
    template_window: int = 5000
    #: A host whose previous page was fetched more than this many days before its next
    #: one starts its template counts afresh; the counts of hosts idle that long are
    #: deleted (``neardup.template``), which bounds the number of hosts kept.
    template_idle_days: int = 30
    #: Index buckets stop growing at this many entries (newer entries are not added).
    bucket_cap: int = 4096
    #: Entries of pages fetched more than this many days before the newest page are
    #: ignored and pruned. 0 keeps everything.
    retention_days: int = 0
    #: Pages whose main text is shorter are rejected as `no_text`.
    min_text_chars: int = 20
    #: Bodies larger than this are rejected before parsing.
    max_bytes: int = 5 * 1024 * 1024
    #: Main text longer than this is rejected as `too_large` before it is fingerprinted:
    #: segmenting a million characters takes about 1.7 s.
    max_text_chars: int = 1_000_000
    #: Seconds one page's analysis (decode, extract, normalise, fingerprint) may take. It
    #: runs in a sandbox child process (``neardup.sandbox``) that is killed past this, and
    #: the page is rejected as `timeout`. 0 analyses in the calling process, unbounded.
    extract_timeout_s: float = 5.0
    #: Memory (MiB) one page's analysis may take in the sandbox above the idle child's
    #: size (its RLIMIT_AS); past it the page is rejected as `too_large`. 0: no limit.
    extract_max_mb: int = 1024

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ValueError(
                f"extractor must be one of {', '.join(EXTRACTORS)}, not {self.extractor!r}"
            )
        if self.segmenter not in ("rjieba", "jieba"):
            raise ValueError(f"segmenter must be 'rjieba' or 'jieba', not {self.segmenter!r}")
        if not 0 <= self.k1 <= self.k2 <= 32:
            raise ValueError(f"need 0 <= k1 <= k2 <= 32, got k1={self.k1} k2={self.k2}")
        if not self.k1 < self.blocks <= 16:
            raise ValueError(f"blocks must be in (k1, 16], got {self.blocks} with k1={self.k1}")
        if self.tables > 256:
            raise ValueError(f"C({self.blocks}, {self.k1}) = {self.tables} tables is too many")
        if not 8 <= self.key_bits <= 64:
            raise ValueError(f"tables would key on {self.key_bits} bits; choose more blocks")
        for name in (
            "keywords", "window", "period_len", "ccs_min_shared", "template_min_df",
            "template_block_min_df",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in (
            "ccs_min",
            "contain_ratio",
            "excerpt_share",
            "excerpt_margin",
            "template_frac",
            "template_block_frac",
            "jaccard_min",
            "jaccard_simhash",
            "containment_min",
            "facts_differ_share",
            "jaccard_sure",
            "jaccard_facts",
            "containment_facts",
        ):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if self.facts_differ < 1 or self.facts_agree < 1 or self.ccs_slack < 0:
            raise ValueError("facts_differ and facts_agree must be >= 1, ccs_slack >= 0")
        if not 0.0 <= self.ccs_contain <= 1.0:  # 0: containment asks nothing of the strings
            raise ValueError("ccs_contain must be in [0, 1]")
        if self.template_window < 100:
            raise ValueError("template_window must be >= 100 pages")
        if self.template_idle_days < 1:
            raise ValueError("template_idle_days must be >= 1")
        if not 16 <= self.sketch_size <= 4096:
            raise ValueError("sketch_size must be in [16, 4096]")
        if not 0 <= self.exact_shingles <= 65536:
            raise ValueError("exact_shingles must be in [0, 65536]")
        if not 0 <= self.minhash_keys <= 64 or self.minhash_shared < 1:
            raise ValueError("minhash_keys must be in [0, 64] and minhash_shared >= 1")
        if self.bucket_cap < 16:
            raise ValueError("bucket_cap must be >= 16")
        if self.retention_days < 0 or self.min_text_chars < 0 or self.max_bytes < 1024:
            raise ValueError("retention_days, min_text_chars >= 0 and max_bytes >= 1024")
        if self.max_text_chars <= self.min_text_chars:
            raise ValueError("max_text_chars must be greater than min_text_chars")
        # "not <=" also refuses NaN, which compares false with everything
        if not 0.0 <= self.extract_timeout_s <= 600.0:
            raise ValueError("extract_timeout_s must be in [0, 600] (0: no sandbox)")
        if self.extract_max_mb != 0 and not 64 <= self.extract_max_mb <= 1 << 20:
            raise ValueError("extract_max_mb must be 0 (no limit) or in [64, 1048576]")

    @property
    def tables(self) -> int:
        """Number of block tables: C(blocks, k1)."""
        return math.comb(self.blocks, self.k1)

    @property
    def key_bits(self) -> int:
        """Bits of the fingerprint that key one table (the smallest such table)."""
        return 64 * (self.blocks - self.k1) // self.blocks

    def index_marker(self) -> str:
        """The parameters that shape the stored index, as a stable string."""
        return ";".join(f"{name}={getattr(self, name)}" for name in INDEX_PARAMS)

    def __str__(self) -> str:
        return ";".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def with_overrides(self, **changes: Any) -> EngineConfig:
        """A validated copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
