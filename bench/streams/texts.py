"""Article texts for the held-out stream, read at run time from the dev stream.

Each dev story has one base page (``transforms: []``); its article is the ``<p>`` text of
the container the dev corpus report names for the page's template. Nothing here is ever
written into the repository: the texts stay third-party content, used only to measure.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from lxml import html as lxml_html

from bench.common import raw_lines, read_jsonl

# The dev labels' charset names, as Python codecs.
_CODECS = {"utf-8": "utf-8", "gb18030": "gb18030", "big5": "big5hkscs", "big5-hkscs": "big5hkscs"}


@dataclass(frozen=True, slots=True)
class Text:
    """One dev story's article: its paragraphs, kind (first/hard_negative/short/...), and
    script (simp/trad)."""

    key: str
    kind: str
    script: str
    paragraphs: tuple[str, ...]

    @property
    def chars(self) -> int:
        return sum(map(len, self.paragraphs))


def _html_of(page: dict[str, object], charset: str) -> str:
    if "html" in page:
        return str(page["html"])
    return base64.b64decode(str(page["body_b64"])).decode(_CODECS.get(charset, charset), "replace")


def load_texts(data: Path) -> list[Text]:
    """The base article of every dev story, in the dev stream's order."""
    report = json.loads((data / "corpus_report.json").read_text(encoding="utf-8"))
    containers = {name: t["container"] for name, t in report["templates"]["templates"].items()}
    labels = read_jsonl(data / "labels.jsonl.gz")
    out: list[Text] = []
    for raw, label in zip(raw_lines(data / "pages.jsonl.gz"), labels, strict=True):
        if label.get("transforms") or label.get("template") not in containers:
            continue
        page = json.loads(raw)
        doc = lxml_html.fromstring(_html_of(page, label.get("charset", "utf-8")))
        found = doc.xpath(containers[label["template"]])
        if not found:
            continue
        paragraphs = tuple(
            " ".join(p.text_content().split()) for p in found[0].iter("p") if p.text_content()
        )
        paragraphs = tuple(p for p in paragraphs if p)
        if paragraphs:
            out.append(Text(label["base"], label["kind"], label.get("script", "simp"), paragraphs))
    return out
