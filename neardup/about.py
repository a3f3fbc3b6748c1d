"""What this install of neardup is: its version, and which way it computes fingerprints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Literal

from neardup import __version__


def fingerprint_path() -> Literal["native", "python"]:
    """``native`` where the Rust module built at install time is in use, else ``python``
    (no Rust at install time, or ``NEARDUP_NATIVE=0``): the same values either way, the
    native path for about a third of the fingerprint stage's CPU."""
    from neardup.fingerprint import native  # numpy and the lexicon: only when asked

    return "native" if native() is not None else "python"


def version_text() -> str:
    """``neardup --version``: the version, then the fingerprint path on a line of its own."""
    return f"neardup {__version__}\nfingerprints: {fingerprint_path()}\n"


class VersionAction(argparse.Action):
    """``--version`` that prints ``version_text`` as it is (argparse's own would join its
    lines) and works the fingerprint path out only when the option is given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and the fingerprint path, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(version_text())
        parser.exit()
