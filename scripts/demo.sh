#!/usr/bin/env bash
# The main job on the bundled sample: set up, then decide every page and print the decisions.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=$(mktemp -d)
.venv/bin/neardup dedup examples/sample.jsonl --out "$out/decisions.jsonl" \
  --clusters "$out/clusters.jsonl" --merges "$out/merges.jsonl" --rejects "$out/rejects.jsonl" \
  && status=0 || status=$?
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'page':<34} {'decision':<10} {'duplicate_of':<18} {'cluster':<18} dist  sim   title")
for line in open(f"{out}/decisions.jsonl", encoding="utf-8"):
    d = json.loads(line)
    print(f"{d['url'][-34:]:<34} {d['decision']:<10} {str(d['duplicate_of']):<18} "
          f"{d['cluster_id']:<18} {str(d['distance']):<5} {str(d['similarity']):<5} {d['title'][:24]}")
for line in open(f"{out}/rejects.jsonl", encoding="utf-8"):
    r = json.loads(line)
    print(f"{str(r['url'])[-34:]:<34} REJECTED   {r['reason']}: {r['detail'][:60]}")
PY
echo "(files in $out; neardup exit status $status: 3 means some pages were rejected)"
