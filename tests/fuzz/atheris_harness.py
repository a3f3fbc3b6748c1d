"""Coverage-guided fuzzing (atheris, libFuzzer) of one target from ``targets.py``.

    python tests/fuzz/atheris_harness.py TARGET [CORPUS_DIR ...] [libFuzzer flags]

TARGET is parse_raw, decode, extract or engine. ``bench/fuzz.py`` runs every target for a
fixed budget and reports what it found. Not a test module: pytest never collects it (its
name does not start with ``test_``, and it runs only as a script), and atheris is not a
dependency of the project: ``pip install atheris`` to run it.

Our Python code is instrumented for coverage (``atheris.instrument_imports``); the C
parsers (lexbor, libxml2) are not, but every input still runs through them, so a crash or
a hang in one is found, only less directedly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["neardup", "tests.fuzz"]):
    from tests.fuzz.targets import TARGETS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer args]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
