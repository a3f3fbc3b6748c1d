"""neardup: near-duplicate detection for Chinese web pages.

The Python API (docs/python.md)::

    import neardup

    for result in neardup.dedup(pages):  # raw-page dicts or RawPage records, in order
        print(result)  # a neardup.Decision, or a neardup.Rejected with its reason

Importing ``neardup`` is cheap: each name below loads its module when first used.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# numpy's OpenBLAS starts a thread per core at import, which spins between calls. The
# engine's matrix products are a few hundred by 64 and gain nothing from it: over the
# 2,744 dev pages that thread used 0.09 s of CPU in `neardup dedup`'s own process, which
# makes no matrix product at all (the sandbox's processes already run with one thread).
# Set before anything imports numpy; a value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"

if TYPE_CHECKING:
    from neardup.about import fingerprint_path
    from neardup.api import Decision, Page, dedup, extract_text, read_pages
    from neardup.config import EngineConfig
    from neardup.engine import Engine
    from neardup.records import Extracted, RawPage, Reason, Rejected
    from neardup.store import MemoryKV, StateError

#: Each public name and the module that defines it.
_EXPORTS = {
    "dedup": "neardup.api",
    "extract_text": "neardup.api",
    "read_pages": "neardup.api",
    "Decision": "neardup.api",
    "Page": "neardup.api",
    "fingerprint_path": "neardup.about",
    "EngineConfig": "neardup.config",
    "Engine": "neardup.engine",
    "Extracted": "neardup.records",
    "RawPage": "neardup.records",
    "Reason": "neardup.records",
    "Rejected": "neardup.records",
    "MemoryKV": "neardup.store",
    "StateError": "neardup.store",
}
__all__ = [
    "Decision",
    "Engine",
    "EngineConfig",
    "Extracted",
    "MemoryKV",
    "Page",
    "RawPage",
    "Reason",
    "Rejected",
    "StateError",
    "__version__",
    "dedup",
    "extract_text",
    "fingerprint_path",
    "read_pages",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neardup' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
