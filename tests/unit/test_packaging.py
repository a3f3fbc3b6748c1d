"""The wheel carries the native module where cargo is found, says why not where it is not,
and ``neardup --version`` names the fingerprint path in use (hatch_build.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import neardup
from neardup.fingerprint import native

ROOT = Path(__file__).resolve().parents[2]
EXPECT_NATIVE = os.environ.get("NEARDUP_EXPECT_NATIVE") == "1"


def _build_wheel(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pip wheel`` of the project, with the hatchling of this environment (no download);
    cargo reuses native/target, so with cargo this takes seconds, not a full compile."""
    environ = {k: v for k, v in os.environ.items() if k != "NEARDUP_EXPECT_NATIVE"} | env
    command = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation"]
    return subprocess.run(
        [*command, "--no-index", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
        timeout=1200,
    )


def _wheel(out: Path) -> Path:
    (wheel,) = out.glob("neardup-*.whl")
    return wheel


@pytest.mark.skipif(shutil.which("cargo") is None and not EXPECT_NATIVE, reason="no cargo on PATH")
def test_a_wheel_built_with_cargo_holds_the_native_module(tmp_path: Path) -> None:
    done = _build_wheel(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheel = _wheel(tmp_path)
    # the stable ABI from CPython 3.11, for this platform: not py3-none-any
    assert wheel.name.startswith("neardup-") and "-cp311-abi3-" in wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (extension,) = [n for n in names if n.startswith("neardup/_native")]
        assert extension in ("neardup/_native.abi3.so", "neardup/_native.pyd")
        assert b"PyInit__native" in zf.read(extension)  # the module neardup imports
        wheel_meta = zf.read(next(n for n in names if n.endswith(".dist-info/WHEEL")))
    assert b"Root-Is-Purelib: false" in wheel_meta
    assert "neardup/fingerprint.py" in names and "neardup/schemas/raw-page.schema.json" in names


def test_without_cargo_the_wheel_is_pure_python_and_the_build_says_so(tmp_path: Path) -> None:
    done = _build_wheel(tmp_path, CARGO=str(tmp_path / "no-such-cargo"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheel = _wheel(tmp_path)
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if "_native" in n]
    said = done.stdout + done.stderr
    assert "WARNING: cannot run" in said and "no-such-cargo" in said
    assert "fingerprints are computed in Python" in said


def test_expect_native_makes_a_wheel_without_it_an_error(tmp_path: Path) -> None:
    done = _build_wheel(tmp_path, CARGO=str(tmp_path / "no-such-cargo"), NEARDUP_EXPECT_NATIVE="1")
    assert done.returncode != 0
    assert not list(tmp_path.glob("*.whl"))
    assert "NEARDUP_EXPECT_NATIVE=1, but cannot run" in done.stdout + done.stderr


@pytest.mark.parametrize("setting", ["1", "0"])
def test_version_names_the_fingerprint_path(setting: str) -> None:
    script = Path(sys.executable).parent / "neardup"
    env = os.environ | {"NEARDUP_NATIVE": setting}
    out = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, env=env, check=True
    )
    first, second = out.stdout.splitlines()
    assert first == f"neardup {neardup.__version__}"
    path = "native" if setting == "1" and native() is not None else "python"
    assert second == f"fingerprints: {path}"
    if EXPECT_NATIVE and setting == "1":
        assert second == "fingerprints: native"
