"""Static group membership (``NEARDUP_GROUP_INSTANCE_ID``, KIP-345), and how a worker
tells that another process has taken its instance id.

A second live process with the same id takes the member's place when it joins. The
broker tells the replaced member so with FENCED_INSTANCE_ID only on requests that carry
the instance id; aiokafka 0.14 sends its heartbeats without it (and does not know that
error code: aio-libs/aiokafka#1186), so the replaced member hears "unknown member id" and
rejoins, which takes the id back: two workers on one id would take it from each other at
every heartbeat, each rejoin revoking and reopening all their tasks.

So the worker asks the coordinator (DescribeGroups) which member holds its instance id,
found by the client id it gives its group consumer (``StaticMember.kwargs``): after each
assignment, that member is itself (``joined``); at each revocation, a holder with another
member id means another process took its place (``replaced``), and it stops rather than
rejoin. (The member id, not the client id, tells the processes apart: a member that takes
a static member's place keeps the client id the broker first saw for it.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

log = logging.getLogger("neardup.kafka")


class InstanceFencedError(Exception):
    """Another live worker has taken this worker's instance id: it must stop."""


class StaticMember:
    """A static member's name in its group, and the check that it still holds it."""

    def __init__(
        self, group: str, instance_id: str, bootstrap: str, client: Mapping[str, Any]
    ) -> None:
        self.group, self.instance_id = group, instance_id
        self.bootstrap, self.client = bootstrap, client
        #: What the group consumer takes: its instance id, and a client id that names it.
        self.kwargs = {"group_instance_id": instance_id, "client_id": f"neardup-{instance_id}"}
        #: The member id the coordinator gave this process at its last assignment.
        self.member_id: str | None = None
        self._parked: asyncio.Future[None] | None = None

    async def joined(self) -> None:
        """Note the member id this process holds its instance id under (call it once
        assigned). Were the id taken in the moment between, this process would note the
        other's, rejoin once, and the other would then find itself replaced and stop."""
        self.member_id = await self._holder()

    async def replaced(self) -> str | None:
        """A line saying so if another process holds this instance id in the group now;
        None if this one does, if none does (the session timed out), or if it cannot be
        told (then the rejoin goes ahead, as it would without the check)."""
        holder = await self._holder()
        if self.member_id is None or holder is None or holder == self.member_id:
            return None
        return (
            f"another worker has taken this one's place in group {self.group} under "
            f"NEARDUP_GROUP_INSTANCE_ID={self.instance_id}: give each worker an id of its "
            "own. This one stops"
        )

    async def park(self) -> None:
        """Never return until ``release``, then raise CancelledError: called by the
        consumer's revocation callback of a replaced member, so that the rejoin aiokafka
        sends when the callback returns is never sent."""
        self._parked = asyncio.get_running_loop().create_future()
        await self._parked

    async def release(self) -> None:
        """End ``park`` (before the consumer is stopped, which waits for the callback)."""
        if self._parked is not None and not self._parked.done():
            self._parked.cancel()
            await asyncio.sleep(0)  # the callback's task ends, cancelled, before we go on

    async def _holder(self) -> str | None:
        """The member id holding this instance id, by DescribeGroups; None if there is
        none, or the coordinator does not answer."""
        from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=5_000, **self.client
        )
        try:
            await admin.start()
            responses = await admin.describe_consumer_groups([self.group])
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("could not ask the group who holds this instance id: %r", exc)
            return None
        finally:
            await admin.close()
        return holder_of([r.to_object() for r in responses], self.group, self.kwargs["client_id"])


def holder_of(described: list[dict[str, Any]], group: str, client_id: str) -> str | None:
    """The member id of ``group``'s member with ``client_id``, from DescribeGroups
    responses (``to_object`` form)."""
    for response in described:
        for g in response["groups"]:
            for member in g["members"] if g["group"] == group else ():
                if member["client_id"] == client_id:
                    return str(member["member_id"])
    return None
