"""The format of what the stages keep in a task's store. Each store, and its changelog,
records the format that wrote it (``neardup.kafka.taskstate``), and a worker refuses state
of another format instead of misreading it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from neardup import __version__
from neardup.flow import codec
from neardup.flow.messages import WireError
from neardup.store import StateError

#: Bump when what a stage keeps in its task store changes so that one side would misread
#: the other's: a key's or a value's byte layout (``pending.Stored`` and ``Pending``, a
#: watermark's held items and sources, bucket and posting entries, the expiry and upkeep
#: stamps, the order task's nodes, the analyse task's ``high``), a key prefix taken for
#: something else, or a key that now holds what another held. A new key that older
#: versions never read needs no bump. Messages kept in a store keep their wire encoding,
#: so a bump of ``codec.VERSION`` changes the format by itself (``current``).
STATE_FORMAT = 2


def current() -> dict[str, int]:
    """This version's format: the stages' own, and the messages' (``codec.VERSION``)."""
    return {"state": STATE_FORMAT, "messages": codec.VERSION}


def marker() -> bytes:
    """What a store and its changelog hold to say which format wrote them."""
    return json.dumps({**current(), "written_by": __version__}).encode()


def read_marker(raw: bytes) -> dict[str, object]:
    """A marker's fields (empty when ``raw`` is not one)."""
    try:
        got = json.loads(raw)
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def fits(found: Mapping[str, object]) -> bool:
    """Whether state with marker ``found`` is of this version's format."""
    return {k: found.get(k) for k in current()} == current()


def describe(found: Mapping[str, object] | None) -> str:
    """A format as the operator reads it: ``format 1 (messages 1)``, and who wrote it."""
    if not found:
        return "no recorded format"
    text = f"format {found.get('state')} (messages {found.get('messages')})"
    if found.get("written_by"):
        text += f", written by neardup {found['written_by']}"
    return text


def unreadable(what: str, raw: bytes, exc: Exception) -> StateError:
    """A stored value that does not unpack: replayed, a step would meet it again, so the
    worker stops, saying so."""
    return StateError(
        f"a stored {what} of {len(raw)} bytes does not unpack ({exc}): the task's store is "
        f"damaged, or not of this version's {describe(current())} (docs/kafka.md, Upgrading)"
    )


def decode_stored(raw: bytes) -> Any:
    """A message a task kept in its store; one that does not decode is ``StateError``,
    not the ``WireError`` of a record that goes to the dead-letter topic."""
    try:
        return codec.decode(raw)
    except WireError as exc:
        raise unreadable("message", raw, exc) from exc
