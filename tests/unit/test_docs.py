"""The docs stay true to the code and to each other.

docs/settings.md is generated from the settings model and the engine config, so a field
added or changed without regenerating it fails here. Links between the pages must land
on a file (and a heading, where they name one), the README stays a short page for users,
and no page names a commit: history lives in git.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# 7 to 40 hex digits with at least one letter and one digit: an abbreviated or full
# commit. 16 digits is the form of page ids, cluster ids and fingerprints, which the
# message examples show, so that length is left out.
_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])(?:[0-9a-f]{7,15}|[0-9a-f]{17,40})\b")


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "settings_doc.py"
    spec = importlib.util.spec_from_file_location("settings_doc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("settings_doc", module)
    spec.loader.exec_module(module)
    return module


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    out = set()
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for line in text.splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return _LINK.findall(text)


def test_the_settings_page_is_current() -> None:
    page = DOCS / "settings.md"
    want = _generator().render()
    assert page.exists(), (
        "docs/settings.md is missing: run .venv/bin/python scripts/settings_doc.py"
    )
    assert page.read_text(encoding="utf-8") == want, (
        "docs/settings.md is out of date: run .venv/bin/python scripts/settings_doc.py"
    )


def test_the_settings_page_names_every_field() -> None:
    from neardup.config import EngineConfig
    from neardup.settings import EngineSettings, Settings

    text = _generator().render()
    for name in EngineConfig.__dataclass_fields__:
        assert f"`{name}`" in text
    for name in EngineSettings.model_fields:
        assert f"`NEARDUP_ENGINE__{name.upper()}`" in text
    for name in Settings.model_fields:
        if name != "engine":
            assert f"`NEARDUP_{name.upper()}`" in text


def test_the_generator_reads_each_fields_own_comment() -> None:
    # the comment above a field, not a neighbour's: k1's row explains the Hamming radii,
    # and the four topic fields share the one comment written above the first
    from neardup.config import EngineConfig
    from neardup.settings import Settings

    engine = dict((tuple(n), c) for n, c in _generator().field_comments(EngineConfig))
    assert "Hamming radius" in engine[("k1", "k2")]
    # a field explained in an earlier field's comment joins that row, not its neighbour's
    for names, comment in engine.items():
        if "jaccard_min" in names:
            assert "``jaccard_min``" in comment, (names, comment)
    worker = dict((tuple(n), c) for n, c in _generator().field_comments(Settings))
    topics = ("topic_raw", "topic_decisions", "topic_merges", "topic_rejects")
    assert worker[topics].startswith("Topics")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no such heading in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_commit(page: Path) -> None:
    found = _HASH.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} names commits {found}: history lives in git"


def test_the_hash_pattern_tells_commits_from_page_ids() -> None:
    assert _HASH.findall("measured at 0d9b422, and at 4c33412f0e") == ["0d9b422", "4c33412f0e"]
    assert not _HASH.findall('"duplicate_of": "2f86a2a56b2df457", a decade, 2026-11-27')
