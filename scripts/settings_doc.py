"""Write docs/settings.md from the settings model and the engine config.

The page is generated so that it cannot drift from the code: each row comes from a field
of ``neardup.config.EngineConfig`` or ``neardup.settings.Settings``, its default and
range from the field itself, and its text from the ``#:`` comment above the field.
``tests/unit/test_docs.py`` fails when the committed page differs from what this prints.
Rerun after changing either class:
    .venv/bin/python scripts/settings_doc.py
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "settings.md"
sys.path.insert(0, str(ROOT))

from neardup import config, settings  # noqa: E402

#: Variables read outside the settings object; their text is kept here, as no field holds it.
_OTHER = {
    "NEARDUP_NATIVE": "`0` turns the native (Rust) fingerprint stage off; the Python path "
    "gives the same values. Command line and worker.",
    "NEARDUP_CACHE_DIR": "Where the keyword lexicon derived from jieba's tables is kept "
    "(default `$XDG_CACHE_HOME/neardup`, else `~/.cache/neardup`; empty: none). It changes "
    "start-up time only, never a decision.",
    "NEARDUP_EXPECT_NATIVE": "`1` makes setup and the native module's tests fail, rather "
    "than fall back or skip, when the native module is missing (CI sets it).",
    "NEARDUP_TOOLS": "Where `scripts/get-helm.sh` installs helm.",
    "NEARDUP_HELM_VERSION": "The helm version `scripts/get-helm.sh` builds.",
    "NEARDUP_FAULT_SEED": "Replays the seeded random kill points of the fault tests.",
}


def field_comments(cls: type) -> list[tuple[list[str], str]]:
    """The class's annotated fields in order, grouped with the ``#:`` comment above them.

    A field with no comment of its own joins the latest earlier comment that names it
    (``jaccard_min`` is explained above ``sketch_size``), else the comment of the field
    before it, as ``#: Topics (...)`` is for the four topic names.
    """
    source = inspect.getsource(cls)
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    groups: list[tuple[list[str], str]] = []
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip().removeprefix("#:").strip())
            row -= 1
        name = node.target.id
        if comment or not groups:
            groups.append(([name], " ".join(comment)))
            continue
        naming = [g for g in groups if f"``{name}``" in g[1]]
        (naming[-1] if naming else groups[-1])[0].append(name)
    return groups


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def prose(comment: str) -> str:
    """A field comment as a table cell: without the variable names the row already gives
    (``(NEARDUP_BROKERS)``, ``(NEARDUP_ORDER_WAIT_MS; 0: ...)``), in Markdown's backticks."""
    text = re.sub(r"\s*\((?:NEARDUP_|\.\.\.|_)[A-Z0-9_., ]*\)", "", comment)
    text = re.sub(r"\(NEARDUP_[A-Z0-9_]+; ", "(", text)
    if text.startswith("... "):  # continues the row above in the source; a row stands alone
        text = text[4:5].upper() + text[5:]
    return cell(text.replace("``", "`"))


def show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def quote(value: Any) -> str:
    return "unset" if value is None else f"`{show(value)}`"


def pydantic_range(name: str, cls: Any) -> str:
    """A field's allowed values: its Literal choices, or its ge/le bounds."""
    field = cls.model_fields[name]
    if typing.get_origin(field.annotation) is typing.Literal:
        return ", ".join(f"`{v}`" for v in typing.get_args(field.annotation))
    low = high = None
    for item in field.metadata:
        low = getattr(item, "ge", low)
        high = getattr(item, "le", high)
    if low is None and high is None:
        return ""
    if high is None:
        return f">= {show(low)}"
    if low is None:
        return f"<= {show(high)}"
    return f"{show(low)} to {show(high)}"


def engine_rows() -> Iterator[str]:
    defaults = {f.name: f.default for f in dataclasses.fields(config.EngineConfig)}
    exposed = set(settings.EngineSettings.model_fields)
    for names, comment in field_comments(config.EngineConfig):
        name = ", ".join(f"`{n}`" for n in names)
        default = ", ".join(show(defaults[n]) for n in names)
        index = ", ".join(n for n in names if n in config.INDEX_PARAMS)
        worker = ", ".join(f"`NEARDUP_ENGINE__{n.upper()}`" for n in names if n in exposed)
        # the extractors' names are a constant beside the class, not in its comment
        choices = "one of " + ", ".join(f"`{e}`" for e in config.EXTRACTORS)
        text = comment.replace("one of ``EXTRACTORS``", choices)
        yield f"| {name} | {default} | {index} | {worker} | {prose(text)} |"


def worker_rows() -> Iterator[str]:
    model = settings.Settings
    for names, text in field_comments(model):
        if names == ["engine"]:
            continue
        variable = ", ".join(f"`NEARDUP_{n.upper()}`" for n in names)
        default = ", ".join(quote(model.model_fields[n].default) for n in names)
        allowed = "; ".join(r for r in (pydantic_range(n, model) for n in names) if r)
        yield f"| {variable} | {default} | {cell(allowed)} | {prose(text)} |"


def render() -> str:
    """The whole page, as this script writes it."""
    out = [
        "# Settings",
        "",
        "<!-- Generated by scripts/settings_doc.py from neardup/config.py and "
        "neardup/settings.py: edit those, then run `.venv/bin/python scripts/settings_doc.py`. -->",
        "",
        "Two objects hold every setting. Both are validated at start-up: a bad value stops",
        "the command or the worker with a line naming the setting, never a traceback.",
        "",
        "## Engine parameters",
        "",
        "`EngineConfig` (`neardup/config.py`) decides how a page is decided. Its string form",
        "is in every decision (`engine.params`). On the command line a parameter is",
        "`--set NAME=VALUE`; the worker reads `NEARDUP_ENGINE__<NAME>` for the ones listed",
        "in the worker column.",
        "",
        "Parameters in the *index* column shape what is written to the index. They are kept",
        "in the state's format marker, and a state directory written with other values is",
        "refused: changing one needs a new state directory.",
        "",
        "| name | default | index | worker variable | meaning |",
        "|---|---|---|---|---|",
        *engine_rows(),
        "",
        "## Worker settings",
        "",
        "`Settings` (`neardup/settings.py`) is one frozen object read from `NEARDUP_*`",
        "environment variables when the worker starts (`python -m neardup.produce` and",
        "`python -m neardup.kafka.tail` read the connection settings too). The Helm chart's",
        "`settings.<key>` maps onto `NEARDUP_<KEY>` one to one. A `NEARDUP_*` variable that",
        "no setting reads gets a warning naming the closest setting.",
        "",
        "| variable | default | allowed | meaning |",
        "|---|---|---|---|",
        *worker_rows(),
        "",
        "## Other variables",
        "",
        "These are read outside the settings object; the worker does not warn about them.",
        "",
        "| variable | meaning |",
        "|---|---|",
        *(f"| `{name}` | {cell(_OTHER.get(name, ''))} |" for name in settings.OTHER_VARIABLES),
        *(
            f"| `{prefix}*` | `scripts/kafka-local.sh`'s own settings (see its header). |"
            for prefix in settings.OTHER_PREFIXES
        ),
        "",
    ]
    return "\n".join(out)


def main() -> None:
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
