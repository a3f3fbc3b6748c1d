"""The decide task's upkeep, beside its decisions (``neardup.flow.decide``): retention of
page records, and pages given up because a record for them could not be read.

Retention: a page's record goes (``sweep``) once the order task's watermark
(``neardup.flow.expiry.Horizon``: no page below it computes matches any more) is
``retention_days`` past the latest fetch time its id came with. Every page still to
decide finds that page expired in the index, as ``neardup dedup`` would, and never asks
for its record. That is where the two part: a page id seen again more than
``retention_days`` after it last came is decided anew here (with no lookup if its host's
template window still holds the id, since the hosts task then sends no probes), where
``neardup dedup``, which keeps every record, answers it with its first decision.

Lost records: a record on an internal topic that no version reads goes to the dead-letter
topic (``neardup.kafka.tasks``). If it was a page's (its key names the page), the page's
decide task is told (``lost_notice``) and gives the page up: the page goes to the
dead-letter topic too, so that it does not wait for ever for an answer or a verdict that
will never come, holding back every page behind it (an open page holds the order task's
watermark). Its id is remembered (a few keys: each is a bug or a corrupted topic): its
answers still to come are dropped, an ask for its record is answered without it, and a
page with its id that comes later is given up too, until the id is sent again after an
operator has seen the dead letters.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable

import orjson

from neardup.analysis import page_pid
from neardup.config import EngineConfig
from neardup.flow.codec import encode
from neardup.flow.expiry import DAY_MS, DayList, day_of
from neardup.flow.messages import (
    PAGES,
    Answer,
    Key,
    Out,
    SketchAsk,
    ToDecide,
    partition_of_pid,
)
from neardup.flow.pending import Pending, Stored, heard_keys
from neardup.flow.watermark import Store, key_bytes
from neardup.records import Reason, Rejected

# The decide task's store: its keys by their first bytes.
RECORD = b"R"  # + pid (8) -> the page's record and its decision (``Stored``)
TODO = b"P"  # + key -> the ToDecide of a page not decided yet
PROGRESS = b"G"  # + key -> what came for a page not decided yet (``Pending.pack``)
# HEARD (``pending.heard_key``): + key + kind + n (4) -> its nth answer or sketch reply
REPEAT = b"W"  # + pid (8) + n (4) -> the nth page of an id whose first is not decided yet
ASK = b"Q"  # + key of the asker -> a SketchAsk waiting for records here
MARK = b"M"  # + source (4) -> its latest Mark
HELD = b"\x01d"  # the watermark's: pages that wait for it, its sources' marks
EXPIRY = b"\x01x"  # + day + pid (8): records by the day of their latest fetch time
SWEPT = b"\x01s"  # fetch time (8) below which records may have gone (``sweep``)
HORIZON = b"\x01o"  # the order task's latest Horizon mark
LOST = b"\x01l"  # + pid (8) -> page id: a page given up, its id remembered
_I64 = struct.Struct(">q")

#: The order of an ``Answer`` that is a ``lost_notice`` (no page has it: fetch times are
#: Unix milliseconds).
LOST_ORDER = -(2**63)
#: The dead-letter topic's role (``neardup.kafka.topology.Topics.by_role``).
REJECTS = "rejects"


def lost_notice(name: str, partitions: int) -> Out:
    """The record that tells page ``name``'s decide task that a record for the page was
    unreadable."""
    pid = page_pid(name)
    notice = Answer((LOST_ORDER, name), pid, (), ())
    return Out(PAGES, partition_of_pid(pid, partitions), name.encode(), encode(notice))


def dead_letter(page_id: str | None, url: str | None, detail: str) -> Out:
    body = Rejected(Reason.INTERNAL, detail, page_id, url).to_json()
    return Out(REJECTS, None, (page_id or "").encode(), orjson.dumps(body))


class Upkeep:
    """Retention and lost pages, for ``DecideTask`` (whose state it reads and writes)."""

    store: Store
    cfg: EngineConfig
    counts: Counter[str]
    pages: dict[Key, Pending]
    repeats: dict[int, list[ToDecide]]
    missing: dict[int, set[Key]]
    listed: DayList
    #: Records with a latest fetch time below this may have been deleted (None: none).
    swept: int | None
    #: The day the order task's watermark has reached, as fetch time (None: not told).
    horizon: int | None
    #: Pids of pages given up.
    lost: set[int]

    def _records(self, pids: Iterable[int]) -> list[Stored | None]:
        raise NotImplementedError  # (DecideTask's)

    def _retry_asks(self, pid: int, out: list[Out]) -> None:
        raise NotImplementedError  # (DecideTask's)

    def load_upkeep(self) -> None:
        self.listed = DayList(self.store, EXPIRY)
        swept, horizon = self.store.get_many([SWEPT, HORIZON])
        self.swept = None if swept is None else _I64.unpack(swept)[0]
        self.horizon = None if horizon is None else _I64.unpack(horizon)[0]
        self.lost = {int.from_bytes(k[len(LOST) :], "big") for k, _ in self.store.scan(LOST)}

    # -- retention ---------------------------------------------------------------------------

    def on_horizon(self, order: int) -> None:
        if self.horizon is None or self.horizon < order:
            self.horizon = order
            self.store.put_many([(HORIZON, _I64.pack(order))])

    def _note(self, pid: int, order: int) -> None:
        if self.cfg.retention_days:
            self.listed.note(day_of(order), [pid.to_bytes(8, "big")])

    def _touch(self, pid: int, stored: Stored, order: int) -> Stored:
        """``stored`` with its id come again at ``order``: kept ``retention_days`` from
        then (written only when the day moves: the sweep goes by days)."""
        if not self.cfg.retention_days or day_of(order) <= day_of(stored.last):
            return stored
        self.listed.unnote(day_of(stored.last), [pid.to_bytes(8, "big")])
        stored = Stored(stored.record, stored.decision, order)
        self.store.put_many([(RECORD + pid.to_bytes(8, "big"), stored.pack())])
        self._note(pid, order)
        return stored

    def _expired(self, ask: SketchAsk) -> bool:
        """Whether a record ``ask`` names and this task lacks may have been swept: the
        asker is older than ``retention_days`` past the records swept, which only a late
        page is (it was below the horizon when they went). A record missing otherwise is
        on its way: every page below this task's watermark has its record here, and the
        asker's candidates are older than the asker."""
        limit = self.cfg.retention_days * DAY_MS
        return self.swept is not None and ask.asker[0] - limit < self.swept

    def sweep(self) -> int:
        """Delete the records whose latest fetch time is ``retention_days`` before the
        horizon's day (as many as one step takes: ``DayList.take``), but those of pages
        not decided yet; how many."""
        if not self.cfg.retention_days or self.horizon is None:
            return 0
        before = day_of(self.horizon - self.cfg.retention_days * DAY_MS)
        if self.swept is None or before * DAY_MS > self.swept:
            self.swept = before * DAY_MS
            self.store.put_many([(SWEPT, _I64.pack(self.swept))])
        pids = [int.from_bytes(p, "big") for p in dict.fromkeys(self.listed.take(before))]
        if not pids:
            return 0
        busy = set(self.repeats)
        busy.update(p.todo.analysed.pid for p in self.pages.values() if p.todo is not None)
        dead: list[int] = []
        again: list[int] = []
        for pid, s in zip(pids, self._records(pids), strict=True):
            if s is None or day_of(s.last) >= before:
                continue  # gone already, or listed again on a later day
            (again if pid in busy else dead).append(pid)
        self.store.delete_many(RECORD + p.to_bytes(8, "big") for p in dead)
        # a page still waiting keeps its record: listed again, for a later sweep
        self.listed.note(before, (p.to_bytes(8, "big") for p in again))
        self.counts["expired"] += len(dead)
        return len(dead)

    # -- lost records ------------------------------------------------------------------------

    def on_lost(self, name: str, out: list[Out]) -> None:
        """A record for page ``name`` could not be read: give up its pages here, now and
        to come, and answer the asks that wait for its record."""
        pid = page_pid(name)
        if pid not in self.lost:
            self.lost.add(pid)
            self.store.put_many([(LOST + pid.to_bytes(8, "big"), name.encode())])
        why = "a record for it on an internal topic was unreadable (see the dead letters)"
        for key, page in [(k, p) for k, p in self.pages.items() if k[1] == name]:
            self.give_up(key, page, why, out)
        self._retry_asks(pid, out)

    def give_up(self, key: Key, page: Pending | None, why: str, out: list[Out]) -> None:
        """Send page ``key`` to the dead-letter topic instead of deciding it, with the
        pages of its id that wait for its decision."""
        todo = page.todo if page is not None else None
        if page is not None:
            del self.pages[key]
            kb = key_bytes(key)
            self.store.delete_many([TODO + kb, PROGRESS + kb, *heard_keys(key, page)])
        url = todo.analysed.page.url if todo is not None else None
        out.append(dead_letter(key[1], url, f"page {key[1]} given up: {why}"))
        self.counts["given_up"] += 1
        if todo is None:
            return
        pid = todo.analysed.pid
        waiting = self.repeats.pop(pid, [])
        at = REPEAT + pid.to_bytes(8, "big")
        self.store.delete_many(at + n.to_bytes(4, "big") for n in range(len(waiting)))
        for m in waiting:
            out.append(dead_letter(m.key[1], m.analysed.page.url, f"page {m.key[1]}: {why}"))
            self.counts["given_up"] += 1
