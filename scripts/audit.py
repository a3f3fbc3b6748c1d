"""Audit requirements.lock for known vulnerabilities; exit 1 on any that is not justified.

    python scripts/audit.py PIP_AUDIT [--lock requirements.lock]
                            [--exceptions scripts/audit-exceptions.txt]

1. pip-audit (the binary given) audits every locked version against PyPI's vulnerability
   data, through PyPI's per-release JSON (``/pypi/<name>/<version>/json``).
2. Where it could not (it reports the package as "not found on PyPI", as it does for every
   package behind a mirror that serves no per-release JSON, this project's machines
   among them), PyPI's project JSON (``/pypi/<name>/json``) is asked instead. Its
   ``vulnerabilities`` are those of the latest release only, so it audits a locked
   version only if that is the latest one; any other version is reported as not audited.
3. A finding, or a version not audited, passes only if ``--exceptions`` names it with a
   reason: a vulnerability by its id or an alias, a version as ``unaudited:name==version``.
   docs/development.md explains each one. A version change makes its
   ``unaudited:`` line stale, so the gap is looked at again.
4. For ``--grace-days`` (14) after the lock was made (the date in its first line), a
   version not audited only because a release came after it passes with a warning: every
   locked version was the latest when ``scripts/lock.sh`` resolved it, so the lock is due
   for a refresh, but CI does not turn red on the day a dependency publishes a release.
   Past the grace, such a version fails as any other.

Standard library only: it runs under the audit's own venv (scripts/audit.sh).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYPI = "https://pypi.org/pypi"


@dataclass(frozen=True)
class Vuln:
    id: str
    aliases: tuple[str, ...]
    fixed_in: tuple[str, ...]
    details: str


@dataclass
class Package:
    name: str
    version: str
    #: how it was audited: "pip-audit", "PyPI project JSON", or "" (not audited)
    source: str = ""
    vulns: list[Vuln] = field(default_factory=list)
    note: str = ""


def lock_date(path: Path) -> dt.date | None:
    """The day ``scripts/lock.sh`` wrote the lock, from its first line (None if absent)."""
    with path.open() as fh:
        found = re.search(r"\bon (\d{4}-\d{2}-\d{2})\b", fh.readline())
    return dt.date.fromisoformat(found.group(1)) if found else None


def read_lock(path: Path) -> dict[str, Package]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                sys.exit(f"audit: {path}: not pinned with ==: {line!r}")
            out[canonical(name)] = Package(name, version)
    return out


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_exceptions(path: Path) -> dict[str, str]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, why = line.strip().partition(" ")
                if not why.strip():
                    sys.exit(f"audit: {path}: {key} has no reason")
                out[key] = why.strip()
    return out


def run_pip_audit(pip_audit: str, lock: Path, packages: dict[str, Package]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [pip_audit, "-r", str(lock), "--no-deps", "--disable-pip"]
        cmd += ["--progress-spinner", "off", "--desc", "on", "-f", "json", "-o", str(report)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode not in (0, 1) or not report.exists():  # 1: vulnerabilities found
            print(f"audit: pip-audit failed ({done.returncode}):\n{done.stderr[-2000:]}")
            return
        for dep in json.loads(report.read_text())["dependencies"]:
            pkg = packages.get(canonical(dep["name"]))
            if pkg is None or dep.get("skip_reason"):
                continue
            pkg.source = "pip-audit"
            pkg.vulns = [
                Vuln(v["id"], tuple(v.get("aliases", [])), tuple(v["fix_versions"]),
                     v.get("description") or "")
                for v in dep.get("vulns", [])
            ]  # fmt: skip


def project_json(name: str) -> dict[str, Any]:
    for attempt in range(3):
        try:
            with urllib.request.urlopen(f"{PYPI}/{name}/json", timeout=30) as r:
                data: dict[str, Any] = json.load(r)
                return data
        except (urllib.error.URLError, TimeoutError) as exc:
            if attempt == 2:
                sys.exit(f"audit: cannot read PyPI's JSON for {name}: {exc}")
            time.sleep(2 * (attempt + 1))
    raise AssertionError("unreachable")


def fall_back(packages: dict[str, Package]) -> None:
    for pkg in packages.values():
        if pkg.source:
            continue
        data = project_json(pkg.name)
        latest = str(data["info"]["version"])
        if latest != pkg.version:
            pkg.note = f"latest is {latest}"
            continue
        pkg.source = "PyPI project JSON"
        pkg.vulns = [
            Vuln(v["id"], tuple(v.get("aliases") or []), tuple(v.get("fixed_in") or []),
                 v.get("summary") or v.get("details") or "")
            for v in data.get("vulnerabilities") or []
            if not v.get("withdrawn")
        ]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pip_audit")
    ap.add_argument("--lock", type=Path, default=Path("requirements.lock"))
    ap.add_argument("--exceptions", type=Path, default=Path("scripts/audit-exceptions.txt"))
    ap.add_argument(
        "--grace-days",
        type=int,
        default=14,
        help="for this many days after the lock was made, a version not audited only "
        "because a release came after it passes with a warning (0: never)",
    )
    args = ap.parse_args()
    made = lock_date(args.lock)
    age = None if made is None else (dt.datetime.now(dt.UTC).date() - made).days
    grace = age is not None and 0 <= age < args.grace_days
    packages = read_lock(args.lock)
    exceptions = read_exceptions(args.exceptions)
    run_pip_audit(args.pip_audit, args.lock, packages)
    by_pip_audit = sum(p.source == "pip-audit" for p in packages.values())
    fall_back(packages)
    by_json = sum(p.source == "PyPI project JSON" for p in packages.values())

    failures, graced, used = 0, 0, set()
    for pkg in sorted(packages.values(), key=lambda p: canonical(p.name)):
        for v in pkg.vulns:
            keys = [v.id, *v.aliases]
            hit = next((k for k in keys if k in exceptions), None)
            status = f"justified: {exceptions[hit]}" if hit else "NOT JUSTIFIED"
            if hit:
                used.add(hit)
            else:
                failures += 1
            print(
                f"audit: {pkg.name}=={pkg.version} {v.id} ({', '.join(v.aliases) or '-'}), "
                f"fixed in {', '.join(v.fixed_in) or 'no release'}: {v.details[:160]!r} "
                f"[{status}]"
            )
        if not pkg.source:
            key = f"unaudited:{pkg.name}=={pkg.version}"
            if key in exceptions:
                used.add(key)
                status = f"justified: {exceptions[key]}"
            elif grace and pkg.note.startswith("latest is"):
                graced += 1
                status = (
                    f"WARNING: the lock is {age} days old, within the {args.grace_days}-day "
                    "grace; refresh it (bash scripts/lock.sh), then run the tests and this audit"
                )
            else:
                failures += 1
                status = f"NOT JUSTIFIED (add '{key} <reason>' to {args.exceptions})"
            print(f"audit: {pkg.name}=={pkg.version} not audited ({pkg.note}) [{status}]")
    for key in sorted(set(exceptions) - used):
        print(f"audit: note: {args.exceptions} lists {key}, which no longer applies")

    found = sum(len(p.vulns) for p in packages.values())
    unaudited = sum(not p.source for p in packages.values())
    print(
        f"audit: {len(packages)} locked packages: {by_pip_audit} audited by pip-audit, "
        f"{by_json} by PyPI's project JSON, {unaudited} not audited; "
        f"{found} known vulnerabilities; {failures} not justified"
        + (f"; {graced} newer than the lock, within its grace" if graced else "")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
