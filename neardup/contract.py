"""The message contract: JSON Schemas for what comes in and goes out, and raw-page parsing.

The canonical schemas live in the repository's top-level ``schemas/`` directory; a wheel
carries them as ``neardup/schemas``. ``parse_raw`` turns one input line into a ``RawPage``
or a ``Rejected`` and never raises.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import orjson
import pybase64

from neardup.records import RawMessage, RawPage, Reason, Rejected

if TYPE_CHECKING:  # jsonschema is imported when first needed: nearly every message takes
    # the fast path, and the import costs 0.1-0.2 s of CPU at every start.
    from jsonschema import Draft202012Validator, FormatChecker
    from jsonschema.exceptions import ValidationError

# Short names used by callers and the CLI self-check, mapped to schema files.
SCHEMA_FILES: Mapping[str, str] = {
    "raw": "raw-page.schema.json",
    "decision": "decision.schema.json",
    "merge": "cluster-merge.schema.json",
    "rejected": "rejected-page.schema.json",
}

# An input line holds the body plus JSON overhead. base64 inflates by 4/3; JSON writers with
# ensure_ascii turn each CJK character (3 UTF-8 bytes) into a 6-byte \uXXXX escape, and some
# escape '<' and '&' as \u003c (6 bytes for 1). 4x covers realistic pages; the exact body
# limit is enforced after parsing, this bound only stops us parsing absurd lines.
LINE_INFLATION = 4
LINE_OVERHEAD = 64 * 1024

# Where to look for a URL in a line that cannot be parsed, so the dead letter is traceable.
_URL_IN_LINE = re.compile(r'"url"\s*:\s*"((?:[^"\\]|\\.){1,4096})"')
_URL_SCAN = 64 * 1024
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII
)
_DETAIL_MAX = 300
MAX_PAGE_ID = 256  # as in raw-page.schema.json


def derive_page_id(url: str) -> str:
    """The page id used when a message carries none: 16 hex digits of SHA-1 of the URL."""
    # surrogatepass: the same bytes for every real URL, and no exception for a broken one
    data = url.encode("utf-8", "surrogatepass")
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()[:16]


def max_line_bytes(max_bytes: int) -> int:
    """Longest input line that ``parse_raw`` will try to parse for a given body limit."""
    return LINE_INFLATION * max_bytes + LINE_OVERHEAD


def schema_dir() -> Traversable:
    """The schemas shipped inside the package, else the repository's ``schemas/``."""
    packaged = resources.files("neardup") / "schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "schemas"


def load_schema(name: str) -> dict[str, Any]:
    """Load a schema by short name (``raw``, ``decision``, ``merge``, ``rejected``) or file name."""
    file_name = SCHEMA_FILES.get(name, name)
    if not file_name.endswith(".json"):
        file_name += ".schema.json"
    schema: dict[str, Any] = json.loads((schema_dir() / file_name).read_text(encoding="utf-8"))
    return schema


def _is_rfc3339(instance: object) -> bool:
    if not isinstance(instance, str):
        return True  # type errors are reported by "type", not by "format"
    match = _RFC3339.match(instance)
    if match is None:
        return False
    # fromisoformat rejects a leap second; RFC 3339 allows it, so check it as :59.
    text = instance[: match.start(1)] + ("59" if match.group(1) == "60" else match.group(1))
    text += instance[match.end(1) :].replace("z", "Z")
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _format_checker() -> FormatChecker:
    # jsonschema checks "date-time" only when the optional rfc3339-validator is installed;
    # a checker of our own keeps the contract the same on every machine.
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    checker.checks("date-time")(_is_rfc3339)
    return checker


@functools.cache
def _validator(kind: str) -> Draft202012Validator:
    # Compiled once per process from files shipped with the package: a constant, not state.
    if kind not in SCHEMA_FILES:
        raise ValueError(f"unknown schema kind {kind!r}; expected one of {sorted(SCHEMA_FILES)}")
    from jsonschema import Draft202012Validator

    schema = load_schema(kind)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_format_checker())


def _json_path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _clip(text: str, limit: int = _DETAIL_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_JSON_TYPES: Mapping[type, str] = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def _describe(error: ValidationError) -> str:
    """One short line per error; never the whole instance (it may be a 5 MB page)."""
    where = _json_path(error)
    if error.validator in ("oneOf", "anyOf") and isinstance(error.validator_value, list):
        names = [n for sub in error.validator_value for n in sub.get("required", [])]
        if names:
            return f"{where}: exactly one of {' or '.join(map(repr, names))} is required"
    if error.validator == "type":
        got = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        return f"{where}: expected {error.validator_value}, got {got}"
    if isinstance(error.instance, dict | list) and error.validator not in (
        "required",
        "additionalProperties",
    ):
        return f"{where}: fails {error.validator} {_clip(json.dumps(error.validator_value), 80)}"
    return f"{where}: {_clip(error.message)}"


def _first_error(kind: str, obj: object) -> ValidationError | None:
    if kind == "raw" and _plainly_valid_raw(obj):
        return None  # what nearly every message is, in 3 us rather than jsonschema's 36
    from jsonschema.exceptions import best_match

    error: ValidationError | None = best_match(_errors(kind, obj))
    # best_match descends into a oneOf's alternatives and would report only one of them
    # ("'html' is a required property"); the alternatives together say more.
    while (
        error is not None
        and error.parent is not None
        and error.parent.validator
        in (
            "oneOf",
            "anyOf",
        )
    ):
        error = cast("ValidationError", error.parent)
    return error


# The constraints of raw-page.schema.json, all of them (annotations left out), that
# ``_plainly_valid_raw`` checks by hand. It is used only while the shipped schema says
# exactly this, so a change to the schema cannot leave it behind.
_RAW_CONSTRAINTS: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["url", "fetched_at", "content_type"],
    "properties": {
        "url": {"type": "string", "minLength": 1},
        "fetched_at": {"type": "string", "format": "date-time"},
        "content_type": {"type": "string"},
        "html": {"type": "string"},
        "body_b64": {"type": "string"},
        "page_id": {"type": "string", "minLength": 1, "maxLength": MAX_PAGE_ID},
        "site": {"type": "string"},
    },
    "oneOf": [{"required": ["html"]}, {"required": ["body_b64"]}],
    "additionalProperties": True,
}
# Keywords that annotate and never reject (contentEncoding does not assert in 2020-12).
_ANNOTATIONS = frozenset({
    "$schema", "$id", "title", "description", "examples", "contentEncoding",
    "contentMediaType",
})  # fmt: skip


def _constraints(schema: object) -> object:
    """A schema without its annotations (property names are kept, whatever they are)."""
    if isinstance(schema, list):
        return [_constraints(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _constraints(v) for k, v in schema.items() if k not in _ANNOTATIONS}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _constraints(v) for k, v in schema["properties"].items()}
    return out


@functools.cache
def _raw_check_applies() -> bool:
    # Read once per process from the file shipped with the package: a constant.
    return _constraints(load_schema("raw")) == _RAW_CONSTRAINTS


def _plainly_valid_raw(obj: object) -> bool:
    """True only for a message that raw-page.schema.json accepts; False says nothing (the
    schema then decides, and says why)."""
    if not isinstance(obj, dict) or not _raw_check_applies():
        return False
    url, fetched_at, page_id = obj.get("url"), obj.get("fetched_at"), obj.get("page_id")
    html, b64, site = obj.get("html"), obj.get("body_b64"), obj.get("site")
    return (
        isinstance(url, str)
        and len(url) >= 1
        and isinstance(obj.get("content_type"), str)
        and isinstance(fetched_at, str)
        and _is_rfc3339(fetched_at)
        # exactly one body, a string
        and (
            (isinstance(html, str) and "body_b64" not in obj)
            or (isinstance(b64, str) and "html" not in obj)
        )
        and (
            "page_id" not in obj or (isinstance(page_id, str) and 1 <= len(page_id) <= MAX_PAGE_ID)
        )
        and ("site" not in obj or isinstance(site, str))
    )


def _errors(kind: str, obj: object) -> Iterator[ValidationError]:
    errors: Iterator[ValidationError] = _validator(kind).iter_errors(obj)
    return errors


def validate(kind: str, obj: object) -> list[str]:
    """Error messages for ``obj`` against the schema of ``kind``; empty when it is valid."""
    errors = sorted(_errors(kind, obj), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [_describe(e) for e in errors]


def _url_from_broken_line(text: str) -> str | None:
    """Best effort: the ``url`` of a line that is not JSON, for a traceable dead letter."""
    for window in (text[:_URL_SCAN], text[-_URL_SCAN:]):
        match = _URL_IN_LINE.search(window)
        if match:
            try:
                url = json.loads(f'"{match.group(1)}"')
            except ValueError:
                return None
            if not isinstance(url, str) or not url:
                return None
            # "\ud800" is a JSON escape but no character: it would make the dead letter
            # unwritable as UTF-8 (a case kept in tests/regressions/parse_raw)
            return _LONE_SURROGATE.sub("\ufffd", url)
    return None


def _rejected(reason: Reason, detail: str, url: str | None, page_id: str | None = None) -> Rejected:
    if page_id is None and url:
        page_id = derive_page_id(url)
    return Rejected(reason=reason, detail=_clip(detail), page_id=page_id, url=url)


def _utf8_bytes_at_most(text: str, limit: int) -> bool:
    # A character is 1 to 4 bytes in UTF-8: avoid encoding a big page just to measure it.
    if len(text) > limit:
        return False
    if 4 * len(text) <= limit:
        return True
    return len(text.encode("utf-8", "surrogatepass")) <= limit


def _load(line: bytes | str, max_bytes: int) -> object | Rejected:
    """The JSON value of a line, or why there is none."""
    limit = max_line_bytes(max_bytes)
    if len(line) > limit:
        head = line[:_URL_SCAN]
        head = head if isinstance(head, str) else head.decode("utf-8", "replace")
        detail = f"message is over {limit} bytes (body limit {max_bytes})"
        return _rejected(Reason.TOO_LARGE, detail, _url_from_broken_line(head))
    if isinstance(line, bytes):
        raw = line
        # orjson reads the bytes as they are, checking UTF-8 itself: 0.09 ms a page less
        # than decoding first. On any error the steps below run to say what is wrong.
        with contextlib.suppress(ValueError, RecursionError):
            parsed: object = orjson.loads(raw)
            return parsed
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            detail = f"message is not valid UTF-8 at byte {exc.start}"
            url = _url_from_broken_line(raw.decode("utf-8", "replace"))
            return _rejected(Reason.BAD_JSON, detail, url)
    try:
        # orjson: 1.5x json's speed on the dev pages (0.117 vs 0.180 ms), and strict
        # (no NaN/Infinity, 64-bit integers, bounded depth) as a wire format should be
        obj: object = orjson.loads(line)
    except json.JSONDecodeError as exc:  # orjson's error is a subclass
        detail = f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
        return _rejected(Reason.BAD_JSON, detail, _url_from_broken_line(line))
    except (ValueError, RecursionError) as exc:  # NaN, a 5000-digit number, [[[[...]]]]
        detail = f"{type(exc).__name__}: {exc}"
        return _rejected(Reason.BAD_JSON, detail, _url_from_broken_line(line))
    return obj


def _body(obj: dict[str, Any], max_bytes: int) -> str | bytes | tuple[Reason, str]:
    """The page body of a schema-valid message, or a reason and detail for rejecting it."""
    if "html" in obj:
        html: str = obj["html"]
        if not _utf8_bytes_at_most(html, max_bytes):
            return Reason.TOO_LARGE, f"html is over {max_bytes} bytes"
        return html
    encoded: str = obj["body_b64"]
    # Reject on size before decoding: n base64 characters hold at least 3n/4 - 2 bytes.
    if 3 * len(encoded) // 4 - 2 > max_bytes:
        return Reason.TOO_LARGE, f"body_b64 is over {max_bytes} bytes"
    try:
        body = _b64decode(encoded)
    except (binascii.Error, ValueError) as exc:
        return Reason.BAD_BASE64, f"body_b64: {exc}"
    if len(body) > max_bytes:
        return Reason.TOO_LARGE, f"body is {len(body)} bytes, over {max_bytes}"
    return body


def _b64decode(encoded: str) -> bytes:
    """``base64.b64decode(encoded, validate=True)``, with pybase64 (SIMD, 20x faster) first.

    pybase64 accepts a subset of what the standard library does (it also refuses excess
    padding such as "QQ==="), with the same bytes; whatever it refuses goes to the standard
    library, which returns the bytes or raises the error that names the problem.
    """
    try:
        decoded: bytes = pybase64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return base64.b64decode(encoded, validate=True)
    return decoded


def _str_field(obj: object, key: str, max_len: int = 1 << 62) -> str | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= max_len else None


def parse_raw(line: bytes | str, max_bytes: int) -> RawPage | Rejected:
    """Parse and validate one raw-page message; a ``Rejected`` says why it is unusable."""
    obj = load_line(line, max_bytes)
    if isinstance(obj, Rejected):
        return obj
    return parse_loaded(obj, max_bytes)


def load_line(line: bytes | str, max_bytes: int) -> object | Rejected:
    """``parse_raw``'s first step: the JSON value of a line, or why there is none."""
    return _load(line, max_bytes)


def parse_loaded(obj: object, max_bytes: int) -> RawPage | Rejected:
    """``parse_raw``'s second step, on what ``load_line`` gave: a reader may look at the
    value between the two (``neardup dedup`` looks its page id up in the state)."""
    url = _str_field(obj, "url")
    page_id = _str_field(obj, "page_id", MAX_PAGE_ID)
    error = _first_error("raw", obj)
    if error is not None:
        return _rejected(Reason.SCHEMA, _describe(error), url, page_id)
    assert isinstance(obj, dict) and url is not None  # the schema guarantees both
    body = _body(obj, max_bytes)
    if isinstance(body, tuple):
        return _rejected(*body, url, page_id)
    return RawPage(
        page_id=page_id or derive_page_id(url),
        url=url,
        fetched_at=obj["fetched_at"],
        content_type=obj["content_type"],
        body=body,
        site=_str_field(obj, "site"),
    )


def parse_message(msg: RawMessage, max_bytes: int) -> RawPage | Rejected:
    """``parse_raw`` of the message, its rejection's detail led by where it came from."""
    result = parse_raw(msg.line, max_bytes)
    if isinstance(result, Rejected) and msg.where:
        return dataclasses.replace(result, detail=f"{msg.where}: {result.detail}")
    return result
