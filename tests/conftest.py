"""Session set-up shared by every tier of tests."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Point the engine's cache (``tables.cache_dir``) at a directory of this session,
    and fill it before any sandbox zygote or worker process starts, so that:

    * the tests neither read nor write the user's ``~/.cache/neardup``;
    * every process loads the lexicon rather than derives it. Deriving it leaves about
      30 MiB of freed heap in the zygote, which its workers then use before their memory
      limit (idle size plus ``extract_max_mb``) counts anything: the sandbox's memory
      tests would pass or fail by whether some earlier process had written the cache.
    """
    if "NEARDUP_CACHE_DIR" not in os.environ:
        _CACHE.append(tempfile.mkdtemp(prefix="neardup-test-cache-"))
        os.environ["NEARDUP_CACHE_DIR"] = _CACHE[0]
    from neardup.tables import _lexicon

    _lexicon()


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _CACHE:
        shutil.rmtree(path, ignore_errors=True)
