"""Yanked versions among the crates of native/Cargo.lock; exit 1 on any.

    python scripts/audit_crates.py [--lock native/Cargo.lock] [--index URL]

This is not a vulnerability audit. cargo-audit reads the RustSec advisory database from
GitHub, and OSV's API answers vulnerability queries; neither is reachable from this
project's machines. crates.io's sparse index is (cargo reads it to build ``native/``), and
it says which versions were yanked: withdrawn by their authors, for a security flaw among
other reasons. So this checks that every crates.io crate in the lock is in the index at
its locked version and not yanked, and prints the versions published after it, and
leaves the advisories unchecked (docs/development.md, Dependency lock and audit, says so).

Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = "https://index.crates.io"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def index_path(name: str) -> str:
    """A crate's file in the sparse index (cargo's layout, by the lowercased name)."""
    name = name.lower()
    if len(name) <= 2:
        return f"{len(name)}/{name}"
    if len(name) == 3:
        return f"3/{name[0]}/{name}"
    return f"{name[:2]}/{name[2:4]}/{name}"


def locked_crates(lock: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, version) of every package in ``lock`` that comes from crates.io, and the
    names of the others (the workspace's own, git or path sources, other registries)."""
    packages = tomllib.loads(lock.read_text(encoding="utf-8")).get("package", [])
    ours = sorted((p["name"], p["version"]) for p in packages if p.get("source") == CRATES_IO)
    others = sorted(p["name"] for p in packages if p.get("source") != CRATES_IO)
    return ours, others


def index_versions(index: str, name: str) -> dict[str, bool]:
    """Every published version of ``name``, and whether it is yanked."""
    url = f"{index.rstrip('/')}/{index_path(name)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        lines = resp.read().decode("utf-8").splitlines()
    return {(e := json.loads(line))["vers"]: bool(e.get("yanked")) for line in lines if line}


def _newer(version: str, versions: dict[str, bool]) -> list[str]:
    def key(v: str) -> tuple[int, ...]:
        core = v.split("+", maxsplit=1)[0].split("-", maxsplit=1)[0]
        return tuple(int(x) if x.isdigit() else 0 for x in core.split("."))

    # releases, not pre-releases (a "-" before any "+build" part)
    released = (v for v, y in versions.items() if not y and "-" not in v.split("+", 1)[0])
    return sorted((v for v in released if key(v) > key(version)), key=key)


def audit(crates: list[tuple[str, str]], index: str) -> int:
    """Print one line a crate; the number of problems (yanked, missing, unreadable)."""
    problems = 0
    for name, version in crates:
        try:
            versions = index_versions(index, name)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                print(f"UNCHECKED {name} {version}: the index answered {exc.code}")
            else:
                print(f"MISSING   {name} {version}: the crate is not in the index")
            problems += 1
            continue
        except (
            urllib.error.URLError,
            OSError,
            ValueError,
            KeyError,
            http.client.HTTPException,
        ) as exc:
            print(f"UNCHECKED {name} {version}: the index did not answer: {exc}")
            problems += 1
            continue
        if version not in versions:
            print(f"MISSING   {name} {version}: not in the index")
            problems += 1
        elif versions[version]:
            print(f"YANKED    {name} {version}")
            problems += 1
        else:
            newer = _newer(version, versions)
            print(f"ok        {name} {version}" + (f" (newer: {newer[-1]})" if newer else ""))
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "native" / "Cargo.lock")
    ap.add_argument("--index", default=INDEX)
    args = ap.parse_args()
    crates, others = locked_crates(args.lock)
    problems = audit(crates, args.index)
    print(
        f"audit_crates: {len(crates)} crates.io crates of {args.lock} against {args.index}: "
        f"{problems} yanked, missing or unchecked; {len(others)} packages from elsewhere "
        f"not checked ({', '.join(others) or 'none'}); advisories not checked (see the "
        "docstring)"
    )
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
