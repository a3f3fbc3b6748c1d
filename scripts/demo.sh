#!/usr/bin/env bash
# The main job on the bundled sample: set up, then decide every page and print the decisions.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=$(mktemp -d)
.venv/bin/neardup dedup examples/sample.jsonl --out "$out/decisions.jsonl" \
  --clusters "$out/clusters.jsonl" --merges "$out/merges.jsonl" --rejects "$out/rejects.jsonl" \
  && status=0 || status=$?
.venv/bin/python scripts/demo_table.py "$out"
echo "(files in $out; neardup exit status $status: 3 means some pages were rejected)"
