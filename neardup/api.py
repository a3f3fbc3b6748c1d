"""neardup as a library: decide pages in memory or against a state directory, extract text.

The same engine as ``neardup dedup`` and ``neardup extract``, for pages a program already
holds: dicts in the raw-page JSON format (``schemas/raw-page.schema.json``) or
``RawPage`` records. A page that cannot be decided comes back as a ``Rejected`` record
with its reason, never as an exception (docs/python.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from neardup.config import EngineConfig
from neardup.records import Extracted, RawPage, Reason, Rejected

if TYPE_CHECKING:
    from neardup.engine import Merge, Outcome

#: What ``dedup`` and ``extract_text`` take: a raw-page dict (the JSON of one line of
#: ``neardup dedup``'s input), a ``RawPage``, or a ``Rejected`` (passed through).
Page: TypeAlias = Mapping[str, Any] | RawPage | Rejected


@dataclass(frozen=True, slots=True)
class Decision:
    """One page's decision. ``message`` is the decision exactly as ``neardup dedup --out``
    writes it (``schemas/decision.schema.json``); the properties read the common fields."""

    message: Mapping[str, Any]
    #: The cluster merges this page caused (``neardup dedup --merges``).
    merges: tuple[Merge, ...] = ()
    #: The page id was decided before (an earlier call with the same ``state``): this is
    #: the stored decision, and nothing was written.
    repeated: bool = False

    @property
    def page_id(self) -> str:
        return str(self.message["page_id"])

    @property
    def url(self) -> str:
        return str(self.message["url"])

    @property
    def kind(self) -> str:
        """``unique``, ``duplicate``, ``contained`` (in an earlier page) or ``contains``."""
        return str(self.message["decision"])

    @property
    def duplicate_of(self) -> str | None:
        """The page id of the earlier page this one matches best, or None."""
        value = self.message.get("duplicate_of")
        return None if value is None else str(value)

    @property
    def duplicate_of_url(self) -> str | None:
        """The URL of the page ``duplicate_of`` names, or None."""
        value = self.message.get("duplicate_of_url")
        return None if value is None else str(value)

    @property
    def cluster_id(self) -> str:
        return str(self.message["cluster_id"])

    @property
    def title(self) -> str:
        return str(self.message.get("title") or "")

    def to_json(self) -> dict[str, Any]:
        return dict(self.message)

    @classmethod
    def of(cls, outcome: Outcome) -> Decision:
        return cls(outcome.decision, outcome.merges, outcome.repeated)


def _as_page(item: object, max_bytes: int) -> RawPage | Rejected:
    """A raw page, validated as a line of ``neardup dedup``'s input is, or why it is not
    one."""
    if isinstance(item, RawPage | Rejected):
        return item
    if not isinstance(item, Mapping):
        detail = f"a page is a raw-page dict or a RawPage, not {type(item).__name__}"
        return Rejected(Reason.SCHEMA, detail)
    import orjson

    from neardup.contract import parse_raw

    url = item.get("url")
    try:
        line = orjson.dumps(dict(item))
    except TypeError as exc:  # a value JSON has no form for (bytes, a datetime...)
        detail = f"not a JSON value: {exc}"
        return Rejected(Reason.BAD_JSON, detail, url=url if isinstance(url, str) else None)
    return parse_raw(line, max_bytes)


def dedup(
    pages: Iterable[Page],
    state: str | os.PathLike[str] | None = None,
    config: EngineConfig | None = None,
) -> Iterator[Decision | Rejected]:
    """Decide each page against every earlier one, in order: one ``Decision`` or
    ``Rejected`` per page, as it is decided.

    ``state``: a directory of RocksDB state, made if missing; a later call with the same
    directory continues against these pages (and returns the stored decision of a page id
    seen before). None keeps the state in memory for this call only. The state is opened
    when iteration starts and held until the iterator is exhausted or closed; opening it
    raises ``StateError`` if it was written with other engine parameters."""
    if isinstance(pages, str | bytes | os.PathLike):
        raise TypeError("dedup takes pages, not a path: dedup(read_pages(path))")
    return _decide(pages, None if state is None else os.fspath(state), config or EngineConfig())


def _decide(
    pages: Iterable[Page], state: str | None, cfg: EngineConfig
) -> Iterator[Decision | Rejected]:
    from neardup.engine import Engine, Outcome
    from neardup.store import open_state

    engine = Engine(open_state(state, cfg), cfg)
    try:
        for result in engine.process_many(_as_page(p, cfg.max_bytes) for p in pages):
            yield Decision.of(result) if isinstance(result, Outcome) else result
    finally:  # also when the caller stops early: the state closes whole
        engine.close()


def read_pages(
    *paths: str | os.PathLike[str], max_bytes: int | None = None
) -> Iterator[RawPage | Rejected]:
    """The pages of raw-page JSONL files (plain or gzip) and WARC files, in order, as
    ``neardup dedup`` reads them; a line or record that is no page is a ``Rejected``."""
    from neardup.sources import iter_pages

    limit = EngineConfig().max_bytes if max_bytes is None else max_bytes
    return iter_pages([os.fspath(p) for p in paths], limit)


def extract_text(page: Page, config: EngineConfig | None = None) -> Extracted | Rejected:
    """The title and main text of one page (``Extracted.title``, ``.text``), as ``neardup
    extract`` finds them, or why there are none. Runs in this process: unlike ``dedup``,
    not bounded in time by the sandbox."""
    from neardup.engine import extract_page, internal_rejection

    cfg = config or EngineConfig()
    raw = _as_page(page, cfg.max_bytes)
    if isinstance(raw, Rejected):
        return raw
    try:
        return extract_page(raw, cfg)
    except Exception as exc:  # a bug, not bad input: logged, and the page rejected
        return internal_rejection(raw, exc)
