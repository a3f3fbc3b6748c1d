"""Fetched record batches' CRCs checked with the CPU's CRC32C instruction.

aiokafka checks the CRC32C of every record batch it fetches (``check_crcs``, on by
default, and left on here) with a table-driven C loop: 67 us for one 131 KB raw page of
the dev set on this machine, against 9 us for ``google_crc32c`` (SSE4.2 or ARMv8's CRC
instructions), slice included. A raw page is read once by the worker, so that is about
0.06 ms of CPU a page saved (``bench/crc.py``).

``install`` has every partition's fetched bytes checked that way first (only when the
consumer checks CRCs at all): a partition whose batches all pass is handed to aiokafka
with its own check off; one with a batch that fails, or in an older format than v2, keeps
aiokafka's check, which raises ``CorruptRecordException`` as before. So no batch is taken
unchecked. Without google-crc32c's C extension (its pure-Python fallback is about 250
times slower than aiokafka's loop) nothing is installed.
"""

from __future__ import annotations

import inspect
import logging
import struct
from typing import Any

import google_crc32c

log = logging.getLogger("neardup.kafka")

#: A v2 record batch's head: base offset, batch length (the bytes after this field),
#: partition leader epoch, magic, CRC (over everything from the attributes on).
_HEAD = struct.Struct(">qiibI")
_LENGTH_END = 12  # base offset and batch length
_CRC_FROM = _HEAD.size
#: What ``install`` wraps: aiokafka's (0.14) ``PartitionRecords.__init__``, by parameter.
_PARTITION_RECORDS_PARAMS = [
    "self",
    "tp",
    "records",
    "aborted_transactions",
    "fetch_offset",
    "key_deserializer",
    "value_deserializer",
    "check_crcs",
    "isolation_level",
]


def batches_valid(data: bytes) -> bool:
    """Whether every whole batch in ``data`` (a partition's fetched records) is a v2 batch
    whose CRC matches. A batch cut short at the end (the fetch's size limit) is not
    checked: aiokafka drops it too, and fetches it again whole."""
    pos, size = 0, len(data)
    while size - pos >= _CRC_FROM:
        _, length, _, magic, crc = _HEAD.unpack_from(data, pos)
        end = pos + _LENGTH_END + length
        if end > size:
            break
        if magic != 2 or length < _CRC_FROM - _LENGTH_END:
            return False
        if google_crc32c.value(data[pos + _CRC_FROM : end]) != crc:
            return False
        pos = end
    return True


def install() -> None:
    """Check fetched batches with ``batches_valid`` before aiokafka does (see above)."""
    from aiokafka.consumer import fetcher  # type: ignore[import-untyped]

    if getattr(fetcher.PartitionRecords, "neardup_crc", False):
        return
    if google_crc32c.implementation != "c":
        log.warning("google-crc32c has no C extension here: aiokafka's own CRC check is kept")
        return
    params = list(inspect.signature(fetcher.PartitionRecords.__init__).parameters)
    if params != _PARTITION_RECORDS_PARAMS:
        log.warning("aiokafka's PartitionRecords takes %s: its own CRC check is kept", params)
        return
    records_class: Any = fetcher.MemoryRecords

    class CheckedRecords(records_class):  # type: ignore[misc]
        """aiokafka's ``MemoryRecords``, keeping the bytes it was made of."""

        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.data = data

    class PartitionRecords(fetcher.PartitionRecords):  # type: ignore[misc]
        neardup_crc = True

        def __init__(  # noqa: PLR0917 - aiokafka's own signature, called positionally
            self,
            tp: Any,
            records: Any,
            aborted_transactions: Any,
            fetch_offset: int,
            key_deserializer: Any,
            value_deserializer: Any,
            check_crcs: bool,
            isolation_level: Any,
        ) -> None:
            data = getattr(records, "data", None)
            check = check_crcs and not (isinstance(data, bytes) and batches_valid(data))
            super().__init__(
                tp,
                records,
                aborted_transactions,
                fetch_offset,
                key_deserializer,
                value_deserializer,
                check,
                isolation_level,
            )

    fetcher.MemoryRecords = CheckedRecords
    fetcher.PartitionRecords = PartitionRecords
