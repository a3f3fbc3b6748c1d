"""neardup's Python API on the sample pages: which pages repeat which, and one page's text.

Run from the repository: python examples/python_api.py [PAGES.jsonl]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import neardup

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sample.jsonl")
# The file's pages as RawPage records, and a Rejected for a line that is no page. A program
# that holds its pages already passes them as dicts in the same raw-page format instead.
pages = list(neardup.read_pages(path))
print(f"neardup {neardup.__version__}, fingerprints computed in {neardup.fingerprint_path()}")

RELATION = {"duplicate": "a duplicate of", "contained": "contained in", "contains": "contains"}
clusters: dict[str, list[str]] = defaultdict(list)
for result in neardup.dedup(pages):  # in memory; state="dir" keeps it for the next call
    if isinstance(result, neardup.Rejected):
        print(f"rejected   {result.url}: {result.reason} ({result.detail})")
        continue
    clusters[result.cluster_id].append(result.url)
    of = result.duplicate_of_url  # the earlier page it matches best, if any
    match = f"  ({RELATION[result.kind]} {of})" if of else ""
    print(f"{result.kind:<10} {result.url}{match}")

decided = sum(map(len, clusters.values()))
print(f"\n{decided} pages decided, in {len(clusters)} clusters; those of more than one page:")
for members in clusters.values():
    if len(members) > 1:
        print("  " + "\n    ".join(members))

first = neardup.extract_text(pages[0])  # a page as a dict or a RawPage
if isinstance(first, neardup.Extracted):
    opening = first.text[:60].replace("\n", " ")
    print(f"\nThe first page's title: {first.title}\nIts main text begins: {opening}…")
