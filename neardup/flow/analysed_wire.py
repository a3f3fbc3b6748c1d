"""An analysed page as JSON, as ``neardup.flow.messages`` carries it between tasks.

The page travels without its body (no stage after analysis reads it); every other field
of ``Analysed`` and ``Fingerprints`` goes by its type: bytes as base64, 64-bit values as
JSON integers, which Python reads back exactly. A field the engine adds travels without
a change here. ``analysed_from_json(analysed_to_json(a)) == a`` but for the body. The
topology's records (``neardup.flow.codec``) carry the fingerprints' byte strings beside
the JSON instead, as they are (``analysed_split``, ``analysed_join``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, overload

import pybase64

from neardup.analysis import Analysed
from neardup.fingerprint import Fingerprints
from neardup.records import RawPage


# pybase64 (SIMD): a fifth of the standard library's time for the same strings, and the
# same binascii.Error (a ValueError) on a malformed one.
@overload
def _b64(b: bytes) -> str: ...
@overload
def _b64(b: None) -> None: ...
def _b64(b: bytes | None) -> str | None:
    return None if b is None else pybase64.b64encode_as_string(b)


@overload
def _unb64(s: str) -> bytes: ...
@overload
def _unb64(s: None) -> None: ...
def _unb64(s: str | None) -> bytes | None:
    return None if s is None else pybase64.b64decode(s, validate=True)


_SCALARS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "str": str}


def _codec(annotation: object) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Encoder and decoder of a field of a simple type, from its annotation."""
    kind = str(annotation).split("[", 1)[0].strip()
    if kind == "bytes":
        return _b64, _unb64
    if kind == "tuple":  # tuple[int, ...]
        return list, (lambda v: tuple(int(x) for x in v))
    if kind in _SCALARS:
        return (lambda v: v), _SCALARS[kind]
    raise TypeError(f"the wire format cannot carry a field of type {annotation!r}")


_FPS_FIELDS = [(f.name, *_codec(f.type)) for f in fields(Fingerprints)]
_FPS_SCALARS = [f for f in _FPS_FIELDS if f[1] is not _b64]
_ANALYSED_FIELDS = [
    (f.name, *_codec(f.type)) for f in fields(Analysed) if f.name not in ("page", "fps")
]


def analysed_to_json(a: Analysed, *, blobs: bool = True) -> dict[str, Any]:
    page = a.page
    out: dict[str, Any] = {
        "page_id": page.page_id,
        "url": page.url,
        "fetched_at": page.fetched_at,
        "content_type": page.content_type,
        "site": page.site,
    }
    out.update((name, enc(getattr(a, name))) for name, enc, _ in _ANALYSED_FIELDS)
    fields = _FPS_FIELDS if blobs else _FPS_SCALARS
    out["fps"] = {name: enc(getattr(a.fps, name)) for name, enc, _ in fields}
    return out


#: The fingerprints' byte strings, which ``analysed_split`` takes out of the JSON.
_FPS_BLOBS = tuple(name for name, enc, _ in _FPS_FIELDS if enc is _b64)


def analysed_split(a: Analysed) -> tuple[dict[str, Any], list[bytes]]:
    """``analysed_to_json`` but for the fingerprints' byte strings, and those strings (in
    ``Fingerprints`` order): sent as they are, they take a quarter less room than as
    base64 in the JSON, and no time to encode."""
    out = analysed_to_json(a, blobs=False)
    return out, [getattr(a.fps, name) for name in _FPS_BLOBS]


def analysed_join(obj: dict[str, Any], blobs: list[bytes]) -> Analysed:
    """The page ``analysed_split`` made ``(obj, blobs)`` of; ``ValueError`` if it did not."""
    if len(blobs) != len(_FPS_BLOBS) or not isinstance(obj.get("fps"), dict):
        raise ValueError(f"not an analysed page: {len(blobs)} byte strings")
    return analysed_from_json(obj, dict(zip(_FPS_BLOBS, blobs, strict=True)))


def analysed_from_json(obj: dict[str, Any], blobs: dict[str, bytes] | None = None) -> Analysed:
    """The page ``analysed_to_json`` made; ``ValueError`` if ``obj`` is not one."""
    try:
        page = RawPage(
            page_id=str(obj["page_id"]),
            url=str(obj["url"]),
            fetched_at=str(obj["fetched_at"]),
            content_type=str(obj["content_type"]),
            body="",
            site=obj["site"],
        )
        fps_obj = obj["fps"]
        # a field missing from the message takes its default (refused if it has none)
        got: dict[str, Any] = {
            name: dec(fps_obj[name]) for name, _, dec in _FPS_FIELDS if name in fps_obj
        }
        got.update(blobs or {})
        fps = Fingerprints(**got)
        rest = {name: dec(obj[name]) for name, _, dec in _ANALYSED_FIELDS if name in obj}
        return Analysed(page=page, fps=fps, **rest)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not an analysed page: {exc!r}") from exc
