"""Frozen records that flow between stages.

Every stage takes one of these and returns the next one or a ``Rejected``.
Nothing here knows about Kafka, files or RocksDB.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum


class Reason(StrEnum):
    """Why a page was rejected; the fixed vocabulary of the dead-letter topic."""

    BAD_JSON = "bad_json"
    SCHEMA = "schema"
    BAD_BASE64 = "bad_base64"
    BAD_INPUT = "bad_input"  # unreadable container: broken gzip stream or WARC record
    TOO_LARGE = "too_large"
    NOT_HTML = "not_html"
    DECODE = "decode"
    NO_TEXT = "no_text"
    TIMEOUT = "timeout"
    INTERNAL = "internal"


def utc_now() -> str:
    """RFC 3339 timestamp in UTC with millisecond precision."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Rejected:
    """A page that cannot be decided, with a typed reason. Data, not an exception."""

    reason: Reason
    detail: str
    page_id: str | None = None
    url: str | None = None
    at: str = field(default_factory=utc_now)

    def to_json(self) -> dict[str, object]:
        return {
            "page_id": self.page_id,
            "url": self.url,
            "reason": str(self.reason),
            "detail": self.detail,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class RawPage:
    """A validated raw-page message. ``body`` is text (``html``) or bytes (``body_b64``)."""

    page_id: str
    url: str
    fetched_at: str
    content_type: str
    body: str | bytes
    site: str | None = None


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A raw-page message not parsed yet (``contract.parse_message`` parses it).

    The Kafka worker hands these to its sandbox, whose child parses them where it
    analyses them: the worker's own process, the busier of the two, then never makes the
    body's text nor encodes it again for the pipe. Counted in instructions (cachegrind,
    400 dev pages through the sandbox): 2.2 million a page fewer in the parent, 1.8
    million more in the child. ``neardup dedup`` parses in its own process instead: there
    the child is the busier one (22 million a page against 5)."""

    line: bytes
    #: Where it came from ("pages.jsonl:12"), put before the detail of its rejection.
    where: str = ""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A page's HTML as text, with the charset chosen and the layer that chose it."""

    page: RawPage
    html: str
    charset: str
    layer: str  # "text" | "header" | "bom" | "meta" | "utf8" | "detector" | "replace"
    #: ``html`` in UTF-8, when decoding had it anyway: the parser reads these bytes
    #: instead of encoding the page a second time (70 us for a 100,000-character page).
    utf8: bytes | None = None


@dataclass(frozen=True, slots=True)
class Extracted:
    """Title and main text of a page, paragraphs kept, template noise removed."""

    page: RawPage
    title: str
    paragraphs: tuple[str, ...]
    #: Prose found anywhere on the page (the main text's paragraphs among it), for the
    #: learned template filter only: a template's leftover paragraph is template text
    #: whether or not the extractor took it into a given page's main text.
    prose: tuple[str, ...] = ()
    #: The runner-up block's paragraphs (the density extractor's, when its best block is
    #: small): the article when the best proves to be a block the host repeats.
    alternative: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join(self.paragraphs)
