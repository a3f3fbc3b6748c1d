"""scripts/audit_crates.py: the sparse index's layout and its verdicts, with the index
replaced by canned files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


@pytest.fixture()
def crates(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = ROOT / "scripts" / "audit_crates.py"
    spec = importlib.util.spec_from_file_location("neardup_audit_crates", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def index_dir(tmp: Path, crates: ModuleType, versions: dict[str, dict[str, bool]]) -> str:
    """A sparse index on disk, in cargo's layout, read through a file:// URL."""
    for name, vers in versions.items():
        f = tmp / crates.index_path(name)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps({"name": name, "vers": v, "yanked": y}) + "\n"
                             for v, y in vers.items()))  # fmt: skip
    return tmp.as_uri()


def test_index_paths_follow_cargos_layout(crates: ModuleType) -> None:
    assert crates.index_path("cc") == "2/cc"
    assert crates.index_path("a") == "1/a"
    assert crates.index_path("syn") == "3/s/syn"
    assert crates.index_path("PyO3") == "py/o3/pyo3"
    assert crates.index_path("jieba-rs") == "ji/eb/jieba-rs"


def test_only_crates_io_packages_of_the_lock_are_audited(
    crates: ModuleType, tmp_path: Path
) -> None:
    lock = tmp_path / "Cargo.lock"
    lock.write_text(
        "version = 4\n\n"
        f'[[package]]\nname = "syn"\nversion = "2.0.1"\nsource = "{CRATES_IO}"\n\n'
        '[[package]]\nname = "neardup-native"\nversion = "0.1.0"\n\n'
        f'[[package]]\nname = "cc"\nversion = "1.0.0"\nsource = "{CRATES_IO}"\n'
    )
    assert crates.locked_crates(lock) == ([("cc", "1.0.0"), ("syn", "2.0.1")], ["neardup-native"])


def test_a_yanked_missing_or_unreadable_version_is_a_problem(
    crates: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = index_dir(
        tmp_path / "index",
        crates,
        {
            "syn": {"2.0.1": False, "2.0.2": False, "3.0.0-rc1": False},
            "cc": {"1.0.0": True},
            "wasi": {
                "0.11.0+wasi-snapshot-preview1": False,
                "0.11.1+wasi-snapshot-preview1": False,
            },
        },
    )
    assert crates.audit([("syn", "2.0.1")], index) == 0
    assert "ok        syn 2.0.1 (newer: 2.0.2)" in capsys.readouterr().out
    assert crates.audit([("wasi", "0.11.0+wasi-snapshot-preview1")], index) == 0
    assert "(newer: 0.11.1+wasi-snapshot-preview1)" in capsys.readouterr().out
    assert crates.audit([("cc", "1.0.0")], index) == 1
    assert "YANKED    cc 1.0.0" in capsys.readouterr().out
    assert crates.audit([("syn", "9.9.9")], index) == 1
    assert "MISSING" in capsys.readouterr().out
    assert crates.audit([("libc", "0.2.0")], index) == 1  # no file for it in the index
    assert "UNCHECKED libc 0.2.0" in capsys.readouterr().out


def test_a_crate_the_index_does_not_know_is_missing(
    crates: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import urllib.error

    def not_found(index: str, name: str) -> dict[str, bool]:
        raise urllib.error.HTTPError(f"{index}/{name}", 404, "Not Found", None, None)  # type: ignore[arg-type]

    monkeypatch.setattr(crates, "index_versions", not_found)
    assert crates.audit([("gone", "1.0.0")], "https://index.example") == 1
    assert "MISSING   gone 1.0.0" in capsys.readouterr().out
