"""Resuming ``neardup dedup`` from a --state directory: the pages an earlier run decided are
left out before they are analysed, which is the expensive part."""

from __future__ import annotations

from collections.abc import Callable

from neardup.engine import Engine, page_pid


class Resume:
    """``sources.iter_pages``' ``skip``: leaves out the pages whose id an earlier run with
    the same state decided. A page id that comes again within this run is not left out:
    the engine answers it with its first decision, as in a run without --state."""

    def __init__(self, engine: Engine, seen: dict[str, str], tick: Callable[[], None]) -> None:
        """``seen`` gets each skipped page's id and URL; ``tick`` is called on each."""
        self.engine, self.seen, self.tick = engine, seen, tick
        self.passed: set[str] = set()  # the ids this run has let through
        self.skipped = 0

    def __call__(self, page_id: str, url: str) -> bool:
        if page_id in self.passed:
            return False
        if self.engine.clusters.page(page_pid(page_id)) is None:
            self.passed.add(page_id)
            return False
        self.skipped += 1
        self.seen.setdefault(page_id, url)
        self.tick()
        return True
