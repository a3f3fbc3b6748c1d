"""hatchling build hook: neardup's fingerprint stage in Rust (``native/``) as ``neardup._native``.

Where cargo is found (``$CARGO``, else ``cargo`` on PATH), every wheel build compiles
``native/`` in release mode and puts the extension in the wheel as
``neardup/_native.abi3.so``; the wheel is then tagged for this platform and CPython 3.11
or later (the module uses the stable ABI, ``abi3-py311`` in native/Cargo.toml). An
editable install (``pip install -e .``) imports ``neardup`` from the source tree, so there
the extension is copied into ``neardup/`` instead (.gitignore keeps it out of git).

Without cargo, or when the build fails (a Rust older than native/Cargo.toml's
rust-version, no access to crates.io), the wheel is pure Python and the build says so
(pip shows it with -v; ``neardup --version`` tells either way): fingerprints are then
computed in Python, the same values for about three times the fingerprint stage's CPU.
``NEARDUP_EXPECT_NATIVE=1`` (CI, the Docker image) makes either an error instead.
Cargo's own cache (``native/target``, or ``$CARGO_TARGET_DIR``) makes a rebuild take
seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: The oldest CPython the module runs on: Cargo.toml's pyo3 feature ``abi3-py311``.
ABI3_FROM = "cp311"
#: Where the extension goes inside the package (imported by neardup/fingerprint.py).
MODULE = "neardup/_native"
_CRATE_LIB = "neardup_native"  # [lib] name in native/Cargo.toml

SLOW_PATH = (
    "neardup is installed without its native fingerprint module: fingerprints are "
    "computed in Python (the same values, for about three times the fingerprint stage's "
    "CPU). Install a "
    "Rust toolchain (https://rustup.rs, Rust >= 1.85) and reinstall to get it; "
    "`neardup --version` says which path is in use."
)


class NativeBuildError(RuntimeError):
    """native/ could not be built: why, in a line."""


def extension_path() -> str:
    """Where the extension goes in the wheel: the file name CPython imports a stable-ABI
    extension module by on this platform."""
    return MODULE + (".pyd" if sys.platform == "win32" else ".abi3.so")


def platform_tag() -> str:
    """This machine's wheel platform tag, as hatchling's own inferred tag has it."""
    from packaging.tags import sys_tags

    tag = next(t for t in sys_tags() if not t.platform.startswith(("manylinux", "musllinux")))
    if sys.platform == "darwin":
        from hatchling.builders.macos import process_macos_plat_tag

        return str(process_macos_plat_tag(tag.platform, compat=False))
    return str(tag.platform)


def build_native(root: Path, cargo: str) -> Path:
    """Build native/ in release mode; the path of the shared library cargo made."""
    manifest = root / "native" / "Cargo.toml"
    command = [cargo, "rustc", "--release", "--lib", "--manifest-path", str(manifest)]
    command += ["--message-format=json-render-diagnostics"]
    if sys.platform == "darwin":  # Python's symbols are resolved when it loads the module
        command += ["--", "-C", "link-arg=-undefined", "-C", "link-arg=dynamic_lookup"]
    # A stable-ABI module needs no interpreter to build against. Without one, pyo3's build
    # scripts also stop watching PATH and VIRTUAL_ENV, which differ in every isolated pip
    # build and would make each install compile pyo3 and this crate again.
    env = {**os.environ, "PYO3_NO_PYTHON": "1"}
    try:
        # stderr (cargo's progress and errors) goes to the build's output as it comes
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, check=False)
    except OSError as exc:
        raise NativeBuildError(f"cannot run {cargo}: {exc}") from exc
    if done.returncode != 0:
        raise NativeBuildError(f"`{' '.join(command[:3])} ...` failed (exit {done.returncode})")
    for line in done.stdout.splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        if message.get("reason") != "compiler-artifact":
            continue
        if message["target"]["name"] == _CRATE_LIB:
            for filename in message["filenames"]:
                if filename.endswith((".so", ".dylib", ".dll")):
                    return Path(filename)
    raise NativeBuildError("cargo reported no shared library for native/")


class NativeHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds the native module to wheels and editable installs, or warns without it."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        target = extension_path()
        try:
            cargo = os.environ.get("CARGO") or shutil.which("cargo")
            if not cargo:
                raise NativeBuildError("no cargo on PATH (and CARGO is not set)")
            self.app.display_info(f"neardup: building native/ with {cargo}")
            library = build_native(root, cargo)
        except NativeBuildError as exc:
            if os.environ.get("NEARDUP_EXPECT_NATIVE") == "1":
                raise NativeBuildError(f"NEARDUP_EXPECT_NATIVE=1, but {exc}") from None
            self.app.display_warning(f"WARNING: {exc}. {SLOW_PATH}")
            if version == "editable":  # a module built from older sources must not stay
                (root / target).unlink(missing_ok=True)
            return
        if version == "editable":
            # written beside it, then renamed over it: a process that has the old file
            # loaded keeps its mapping, where overwriting it in place would crash it
            part = root / f"{target}.part"
            shutil.copyfile(library, part)
            part.replace(root / target)
        else:
            build_data["force_include"][str(library)] = target
            build_data["pure_python"] = False
            build_data["tag"] = f"{ABI3_FROM}-abi3-{platform_tag()}"
        self.app.display_info(f"neardup: native module {target} from {library}")
