"""A worker SIGKILLed and started again at once, with and without NEARDUP_GROUP_INSTANCE_ID:
from the kill to every task open again. Prints figures; asserts nothing (the integration
test tests/integration/test_static_membership.py does).

    .venv/bin/python bench/restart.py [--partitions 2] [--runs 1]

Two workers on the test stream (tests/integration/helpers.py ``stream``), the default
session timeout (NEARDUP_SESSION_TIMEOUT_MS, 10 s). Uses KAFKA_BOOTSTRAP_SERVERS, or starts
scripts/kafka-local.sh on free loopback ports. A static member started again gets its
tasks back when it has joined and restored them; a dynamic one waits for the group to drop
the dead member (the session timeout), and the other worker's tasks are rebalanced too.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.helpers import Deployment, LocalBroker, stream
from tests.integration.test_static_membership import _opened, _settled


def once(bootstrap: str, tmp: Path, partitions: int, static: bool) -> tuple[float, int]:
    """Seconds from the kill to every task open again; tasks the other worker reopened."""
    d = Deployment(bootstrap, tmp, partitions)

    def env(i: int) -> dict[str, str]:
        return {"NEARDUP_GROUP_INSTANCE_ID": f"w{i}"} if static else {}

    try:
        d.produce(stream())
        other, killed = d.worker(0, env(0)).start(), d.worker(1, env(1)).start()
        d.wait(lambda: _settled(d, [other, killed]), 240, "both workers running their tasks")
        mark = other.log.stat().st_size
        killed.kill()
        t0 = time.monotonic()
        back = d.worker(1, env(1)).start()
        d.wait(lambda: _settled(d, [other, back]), 240, "every task open again")
        return time.monotonic() - t0, len(_opened(other, mark))
    finally:
        d.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="neardup-restart-"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None
    if not bootstrap:
        broker = LocalBroker(tmp / "kafka")
        broker.run("start")
        bootstrap = broker.bootstrap
    try:
        for run in range(args.runs):
            for static in (True, False):
                name = "with an instance id" if static else "without one"
                seconds, reopened = once(
                    bootstrap, tmp / f"{run}-{static}", args.partitions, static
                )
                print(
                    f"{name}: SIGKILL and start again to every task open {seconds:.1f} s; "
                    f"the other worker reopened {reopened} tasks",
                    flush=True,
                )
    finally:
        if broker is not None:
            broker.run("stop", check=False)


if __name__ == "__main__":
    main()
