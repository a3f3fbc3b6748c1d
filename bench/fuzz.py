"""Run the atheris fuzz targets for a fixed budget, and say what was tried and found.

    .venv/bin/pip install atheris
    .venv/bin/python bench/fuzz.py [--seconds 300] [--targets parse_raw,decode,extract,engine]
                                   [--workdir DIR] [--save]

Each target (``tests/fuzz/targets.py``) starts from seeds generated here (well-formed
pages, mislabelled charsets, the hostile inputs of the unit tests, cut small) plus the
corpus a previous run left in ``--workdir``, and runs under libFuzzer with a per-input
time limit (a hang is a finding) and a memory limit. A finding stops libFuzzer; the run
goes on with the rest of the budget. ``--save`` copies each finding into
``tests/regressions/<target>/``, where ``tests/regressions/test_regressions.py`` replays
it. Prints, per target: inputs tried, seconds, inputs per second, corpus size, findings.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT
from tests.fuzz import inputs
from tests.fuzz.targets import CONTENT_TYPES, EXTRACTORS, TARGETS

HARNESS = ROOT / "tests" / "fuzz" / "atheris_harness.py"
REGRESSIONS = ROOT / "tests" / "regressions"
# Per-target input size cap: parsing is cheap per byte, the engine is not.
MAX_LEN = {"parse_raw": 16_384, "decode": 65_536, "extract": 65_536, "engine": 65_536}
#: libFuzzer's per-input limit: an input that takes longer is a finding (a hang). Pages
#: of at most 64 KiB take milliseconds; ``--timeout 2`` hunts superlinear cases.
PER_INPUT_TIMEOUT_S = 10
RSS_LIMIT_MB = 3072
_DICT = [
    '"url"', '"fetched_at"', '"content_type"', '"html"', '"body_b64"', '"page_id"', '"site"',
    '"2026-03-01T00:00:00Z"', '"text/html; charset=gbk"', "<p>", "</p>", "<div>", "<br>",
    "<title>", "<h1>", '<meta charset="', "<!DOCTYPE", "<![CDATA[", "<!--", "-->", "&amp;",
    "&#x4e2d;", "<script>", "<table>", "<td>", "<section>", "。", "，", "责任编辑：",
    "版权所有", "<?xml", "<!ENTITY", "\\u003c", "\\ud800",
]  # fmt: skip


@dataclass
class Result:
    target: str
    runs: int = 0
    seconds: float = 0.0
    corpus: int = 0
    findings: list[tuple[Path, str]] = field(default_factory=list)


def _seed_pages(rng: random.Random) -> list[str]:
    html = [inputs.page_html(inputs.article(rng, n)) for n in (1, 3, 6)]
    html += [
        inputs.deep_nesting("div", 400),
        inputs.deep_nesting("b", 300),
        inputs.tiny_elements(300, "<i>x</i>"),
        inputs.entity_flood(40),
        inputs.cdata_flood(40),
        inputs.attribute_flood(200),
        inputs.billion_laughs(),
        inputs.external_entities("http://127.0.0.1:9"),
        "<html><body><section><span>微信文章的正文，一段一段。</span></section></body></html>",
        "<html><body><table><tr><td>表格里的正文，很长很长的一段话。</td></tr></table></body></html>",
        "<html><body><p>责任编辑：张三</p><p>本文来源：新华社</p></body></html>",
    ]
    return html


def seeds(target: str, rng: random.Random) -> list[bytes]:
    """Small, varied, valid-looking inputs for ``target``'s byte format."""
    pages = _seed_pages(rng)
    if target == "extract":
        return [bytes([i % len(EXTRACTORS)]) + h.encode() for i, h in enumerate(pages)]
    if target == "decode":
        out = []
        for i, h in enumerate(pages[:6]):
            for codec in ("utf-8", "gbk", "big5", "utf-16"):
                with_label = rng.randrange(len(CONTENT_TYPES))
                out.append(bytes([with_label]) + h.encode(codec, "xmlcharrefreplace"))
            out.append(bytes([0x80 | i]) + h.encode())
        out += [bytes([0]) + inputs.PDF[:64], bytes([1]) + inputs.gzip_body(pages[0])]
        return out
    msgs = [inputs.message(f"https://s.example.cn/{i}", h) for i, h in enumerate(pages)]
    msgs.append(
        inputs.b64_message(
            "https://s.example.cn/b", pages[0].encode("gbk"), "text/html; charset=gbk"
        )
    )
    msgs.append({k: v for k, v in msgs[0].items() if k != "fetched_at"})
    msgs.append({**msgs[0], "page_id": "x", "site": "s"})
    lines = [inputs.line(m) for m in msgs]
    if target == "parse_raw":
        return lines + [line[: len(line) // 2] for line in lines[:3]]
    # engine: a few messages per input, NUL-separated; mode byte 1 = html
    chunks = [bytes([1]) + h.encode() for h in pages] + [bytes([0]) + ln for ln in lines]
    return [b"\0".join(rng.sample(chunks, 3)) for _ in range(12)]


def _write_corpus(corpus: Path, target: str) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in seeds(target, random.Random(target)):
        name = hashlib.sha1(seed).hexdigest()
        (corpus / name).write_bytes(seed[: MAX_LEN[target]])


_RUNS = re.compile(r"^#(\d+)\s", re.M)
_DONE = re.compile(r"Done (\d+) runs in")
_EXC = re.compile(r"=== Uncaught Python exception: ===\n(.*?)\n(?:Traceback|$)", re.S)


def _summary(artifact: Path, log: str, timeout: int) -> str:
    """One line saying what went wrong: the exception, or libFuzzer's verdict."""
    if artifact.name.startswith("timeout-"):
        return f"hang: over {timeout} s on one input"
    if artifact.name.startswith("oom-"):
        return f"out of memory: over {RSS_LIMIT_MB} MB"
    tail = log.strip().splitlines()
    errors = [ln for ln in tail if re.match(r"^\w*(Error|Exception)\b|^AssertionError", ln)]
    match = _EXC.search(log)
    return (errors[-1] if errors else match.group(1) if match else "crash")[:200]


def _escape(token: str) -> str:
    """A dictionary token as libFuzzer reads it: printable ASCII, else \\xNN per byte."""
    return "".join(
        chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in token.encode()
    )


def fuzz(target: str, seconds: float, workdir: Path, timeout: int) -> Result:
    corpus, artifacts = workdir / target / "corpus", workdir / target / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    _write_corpus(corpus, target)
    dict_file = workdir / "tokens.dict"
    dict_file.write_text("".join(f'"{_escape(tok)}"\n' for tok in _DICT), encoding="ascii")
    result = Result(target)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 5:
        before = set(artifacts.iterdir())
        t0 = time.monotonic()
        cmd = [
            sys.executable, str(HARNESS), target, str(corpus),
            f"-max_total_time={int(left)}", f"-timeout={timeout}",
            f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={MAX_LEN[target]}",
            f"-artifact_prefix={artifacts}/", f"-dict={dict_file}", "-print_final_stats=1",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        result.seconds += time.monotonic() - t0
        log = done.stdout + done.stderr
        final = _DONE.search(log)
        counts = [int(n) for n in _RUNS.findall(log)]
        result.runs += int(final.group(1)) if final else max(counts, default=0)
        new = sorted(set(artifacts.iterdir()) - before)
        result.findings += [(a, _summary(a, log, timeout)) for a in new]
        if done.returncode == 0 or not new:
            if done.returncode != 0:
                print(f"  {target}: libFuzzer exited {done.returncode}:\n{log[-2000:]}")
            break
    result.corpus = len(list(corpus.iterdir()))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300, help="budget per target")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--workdir", type=Path, help="keep corpora here (default: a temp dir)")
    ap.add_argument("--save", action="store_true", help="copy findings to tests/regressions")
    ap.add_argument("--timeout", type=int, default=PER_INPUT_TIMEOUT_S, help="per input, s")
    args = ap.parse_args()
    try:
        import atheris  # noqa: F401
    except ImportError:
        raise SystemExit("bench/fuzz.py needs atheris: .venv/bin/pip install atheris") from None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="neardup-fuzz-"))
    results = []
    for target in args.targets.split(","):
        print(f"fuzzing {target} for {args.seconds:.0f} s ...", flush=True)
        results.append(fuzz(target, args.seconds, workdir, args.timeout))
    header = ("target", "inputs", "seconds", "inputs/s", "corpus")
    print("\n{:10s} {:>10s} {:>8s} {:>9s} {:>7s}  findings".format(*header))
    for r in results:
        rate = r.runs / max(r.seconds, 1e-9)
        row = (r.target, r.runs, r.seconds, rate, r.corpus, len(r.findings))
        print("{:10s} {:10d} {:8.0f} {:9.0f} {:7d}  {}".format(*row))
        for artifact, what in r.findings:
            print(f"    {artifact.name}: {what}")
            if args.save:
                dest = REGRESSIONS / r.target / artifact.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(artifact, dest)
                print(f"      saved as {dest.relative_to(ROOT)}")
    print(f"total inputs: {sum(r.runs for r in results)}; corpora in {workdir}")


if __name__ == "__main__":
    main()
