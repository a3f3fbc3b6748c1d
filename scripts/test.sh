#!/usr/bin/env bash
# The test command: set up .venv, then lint, type-check and run the whole test suite.
# Extra arguments go to pytest.
#
# The integration tests need a Kafka broker. Unless KAFKA_BOOTSTRAP_SERVERS is set, this
# starts a throwaway one with scripts/kafka-local.sh (free loopback ports, a run directory
# of its own, so a broker you already run is left alone) and stops it on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check neardup tests bench scripts
.venv/bin/mypy

if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    # a port whose successor (the controller's) is free too
    port="$(.venv/bin/python - <<'EOF'
import socket
for _ in range(100):
    with socket.socket() as a:
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
    print(port)
    break
EOF
)"
    kafka_dir="$(mktemp -d "${TMPDIR:-/tmp}/neardup-kafka-test.XXXXXX")"
    stop_broker() {
        NEARDUP_KAFKA_DIR="$kafka_dir" NEARDUP_KAFKA_PORT="$port" \
            bash scripts/kafka-local.sh stop >/dev/null 2>&1 || true
        rm -rf "$kafka_dir"
    }
    trap stop_broker EXIT
    NEARDUP_KAFKA_DIR="$kafka_dir" NEARDUP_KAFKA_PORT="$port" bash scripts/kafka-local.sh start
    export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$port"
fi

.venv/bin/python -m pytest "$@"
