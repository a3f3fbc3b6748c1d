"""A held-out stream of the dev stream's kind on site templates unlike the dev ones.

Table-layout portals, forums with a stale post and rules, blogs with a
self-introduction, footers with hotlines and licence numbers, a stock-quote disclaimer,
small sites of a few pages, legacy-charset pages whose navigation is rare characters: all
composed here as Python code (``portals``, ``community``), filled at run time with the
dev stream's article texts (``texts``) and the dev stream's transformations
(``transforms``), plus formulaic announcements as hard negatives (``formulaic``).
``heldout.build`` returns the pages and labels in the dev stream's formats;
``python -m bench.streams --out DIR`` writes them as ``pages.jsonl.gz`` and
``labels.jsonl.gz``. The output holds third-party texts: never commit it.
"""
