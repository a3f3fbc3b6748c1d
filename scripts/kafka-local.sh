#!/usr/bin/env bash
# kafka-local.sh - run a throwaway single-node Kafka 4.x broker (KRaft combined
# broker+controller mode, no ZooKeeper, no Docker) on 127.0.0.1 for local
# development and integration tests.
#
# The broker jars come from Maven Central (via `mvn`) rather than the Apache
# release tarball, so only a JDK 17+ and Maven are needed.
#
# Subcommands:
#   fetch          download kafka_2.13 + runtime deps + log4j2/SLF4J binding (idempotent)
#   start          fetch if needed, write config, format storage, start the broker
#                  in the background and wait (deadline) until it serves metadata and
#                  has group + transaction coordinators; prints
#                  NEARDUP_BROKERS=127.0.0.1:<port> (what the worker reads) and
#                  KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:<port> (what the integration tests
#                  read). No-op if already running.
#   stop [--keep]  SIGTERM (up to 60 s, then SIGKILL); removes the run dir unless --keep
#   status         exit 0 if the broker is running, 1 otherwise
#   env            print `export NEARDUP_BROKERS=127.0.0.1:<port>` and `export
#                  KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:<port>` (and, in secured mode, the
#                  SASL listeners' variables below): eval "$(bash scripts/kafka-local.sh env)"
#
# Environment:
#   NEARDUP_KAFKA_VERSION     Kafka release to use (default: 4.1.1)
#   NEARDUP_KAFKA_CACHE       jar cache dir; jars go to $NEARDUP_KAFKA_CACHE/libs
#                             (default: $HOME/.cache/neardup/kafka-<version>)
#   NEARDUP_KAFKA_DIR         run dir: config, data, logs, pid (default: /tmp/neardup-kafka)
#   NEARDUP_KAFKA_PORT        client (PLAINTEXT) port; the controller uses port+1
#                             (default: 19092)
#   NEARDUP_KAFKA_HEAP        JVM heap flags (default: "-Xms256m -Xmx512m")
#   NEARDUP_KAFKA_JAVA_OPTS   extra JVM flags (e.g. a JAAS config for SASL)
#   NEARDUP_KAFKA_START_TIMEOUT  seconds to wait for readiness (default: 90)
#   NEARDUP_KAFKA_GROUP_DELAY_MS  group.initial.rebalance.delay.ms: how long a new group
#                             waits for more members before its first assignment
#                             (default: 0, so that tests' groups form at once; Kafka's
#                             own default, a production broker's, is 3000)
#   JAVA, MVN                 java / mvn binaries (default: from PATH)
#
# Secured mode (opt-in; the default above is unchanged): with NEARDUP_KAFKA_SECURE=1 the
# broker keeps its PLAINTEXT listener (the readiness probe uses it) and adds
#   SASL_PLAINTEXT://127.0.0.1:$NEARDUP_KAFKA_SASL_PORT      (default: port+2)
#   SASL_SSL://127.0.0.1:$NEARDUP_KAFKA_SASL_SSL_PORT        (default: port+3; only with
#                                                            a keystore)
# both with the SASL mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
#   NEARDUP_KAFKA_SASL_USERS  required: "name:password[,name:password...]". Each user can
#                             log in with all three mechanisms: PLAIN users are written
#                             into the listeners' JAAS config in server.properties (mode
#                             600), SCRAM users are added when the storage is formatted
#                             (`StorageTool format --add-scram`), so changing them needs a
#                             new NEARDUP_KAFKA_DIR. Names and passwords: [A-Za-z0-9._~+=-]
#                             (no quotes, commas or brackets, which the formats cannot
#                             escape). For a throwaway test broker: the passwords are on
#                             the format command line and in the run dir.
#   NEARDUP_KAFKA_SSL_KEYSTORE           PKCS12 keystore of the SASL_SSL listener: the
#                             broker's key and a certificate for IP 127.0.0.1, signed by a
#                             CA of the caller's (clients trust that CA); unset: no SASL_SSL
#   NEARDUP_KAFKA_SSL_KEYSTORE_PASSWORD  its password (default: empty)
#   NEARDUP_KAFKA_ACLS        1: an authorizer (StandardAuthorizer): a SASL user may do only
#                             what ACLs grant it; the PLAINTEXT listener's clients
#                             (User:ANONYMOUS) are super users, and grant them
# `start` and `env` then also print KAFKA_SASL_PLAINTEXT_SERVERS=127.0.0.1:<port> and, with
# a keystore, KAFKA_SASL_SSL_SERVERS=127.0.0.1:<port>.
#
# Example:
#   scripts/kafka-local.sh start && eval "$(scripts/kafka-local.sh env)"
#   ... run the worker (it reads $NEARDUP_BROKERS), or tests against $KAFKA_BOOTSTRAP_SERVERS ...
#   scripts/kafka-local.sh stop
set -euo pipefail

KAFKA_VERSION="${NEARDUP_KAFKA_VERSION:-4.1.1}"
SCALA_BINARY="2.13"
# Kafka 4.x logs through SLF4J 1.7.x (slf4j-api 1.7.36) backed by log4j2, so the
# binding is log4j-slf4j-impl (the SLF4J 1.x bridge) - the same set the Apache
# binary distribution ships. log4j-slf4j2-impl would NOT bind to slf4j-api 1.7.
LOG4J_VERSION="2.24.3"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

CACHE_DIR="${NEARDUP_KAFKA_CACHE:-$HOME/.cache/neardup/kafka-$KAFKA_VERSION}"
LIBS_DIR="$CACHE_DIR/libs"
RUN_DIR="${NEARDUP_KAFKA_DIR:-/tmp/neardup-kafka}"
PORT="${NEARDUP_KAFKA_PORT:-19092}"
CONTROLLER_PORT="$((PORT + 1))"
HOST="127.0.0.1"
# Word-split the flag strings into arrays once, so they are never glob-expanded.
read -r -a HEAP_OPTS <<<"${NEARDUP_KAFKA_HEAP:--Xms256m -Xmx512m}"
read -r -a EXTRA_JAVA_OPTS <<<"${NEARDUP_KAFKA_JAVA_OPTS:-}"
START_TIMEOUT="${NEARDUP_KAFKA_START_TIMEOUT:-90}"
GROUP_DELAY_MS="${NEARDUP_KAFKA_GROUP_DELAY_MS:-0}"
SECURE="${NEARDUP_KAFKA_SECURE:-0}"
SASL_PORT="${NEARDUP_KAFKA_SASL_PORT:-$((PORT + 2))}"
SASL_SSL_PORT="${NEARDUP_KAFKA_SASL_SSL_PORT:-$((PORT + 3))}"
SASL_USERS="${NEARDUP_KAFKA_SASL_USERS:-}"
SSL_KEYSTORE="${NEARDUP_KAFKA_SSL_KEYSTORE:-}"
SSL_KEYSTORE_PASSWORD="${NEARDUP_KAFKA_SSL_KEYSTORE_PASSWORD:-}"
SASL_MECHANISMS="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
STOP_TIMEOUT=60
NODE_ID=1

JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"

PROPS_FILE="$RUN_DIR/server.properties"
LOG4J_FILE="$RUN_DIR/log4j2.properties"
DATA_DIR="$RUN_DIR/data"
LOG_FILE="$RUN_DIR/server.log"
PID_FILE="$RUN_DIR/kafka.pid"
FETCH_STAMP="$LIBS_DIR/.complete-$KAFKA_VERSION"

log() { echo "kafka-local: $*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- fetch

fetch() {
    if [[ -f "$FETCH_STAMP" ]]; then
        log "Kafka $KAFKA_VERSION jars already in $LIBS_DIR"
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 || die "Maven ('$MVN') not found"
    mkdir -p "$CACHE_DIR"
    local pom="$CACHE_DIR/pom.xml" tmp="$CACHE_DIR/libs.tmp"
    cat >"$pom" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by kafka-local.sh: only used to resolve the broker classpath -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.neardup</groupId>
  <artifactId>kafka-local-libs</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_$SCALA_BINARY</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>$LOG4J_VERSION</version>
      <scope>runtime</scope>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>$LOG4J_VERSION</version>
      <scope>runtime</scope>
    </dependency>
  </dependencies>
</project>
EOF
    log "fetching Kafka $KAFKA_VERSION (kafka_$SCALA_BINARY + runtime deps) into $LIBS_DIR"
    rm -rf "$tmp"
    # mvn's output goes to a log (it is only noise when things work).
    if ! "$MVN" -B -Dstyle.color=never -f "$pom" "$DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$CACHE_DIR/fetch.log" 2>&1; then
        tail -n 40 "$CACHE_DIR/fetch.log" >&2
        die "mvn dependency:copy-dependencies failed (full log: $CACHE_DIR/fetch.log)"
    fi
    [[ -f "$tmp/kafka_$SCALA_BINARY-$KAFKA_VERSION.jar" ]] \
        || die "mvn finished but kafka_$SCALA_BINARY-$KAFKA_VERSION.jar is missing"
    rm -rf "$LIBS_DIR"
    mv "$tmp" "$LIBS_DIR"
    touch "$FETCH_STAMP"
    log "fetched $(find "$LIBS_DIR" -name '*.jar' | wc -l) jars"
}

# ---------------------------------------------------------------- config

# ---------------------------------------------------------------- secured mode

secure() { [[ "$SECURE" == 1 ]]; }
with_ssl() { secure && [[ -n "$SSL_KEYSTORE" ]]; }

# The users as "name password" lines, after checking every name and password.
sasl_users() {
    local pair name password pairs
    [[ -n "$SASL_USERS" ]] || die "NEARDUP_KAFKA_SECURE=1 needs NEARDUP_KAFKA_SASL_USERS"
    IFS=',' read -r -a pairs <<<"$SASL_USERS"
    for pair in "${pairs[@]}"; do
        name="${pair%%:*}"
        password="${pair#*:}"
        # never echo a password, not even in an error
        [[ "$pair" == *:* && "$name" =~ ^[A-Za-z0-9._~+=-]+$ \
            && "$password" =~ ^[A-Za-z0-9._~+=-]+$ ]] \
            || die "NEARDUP_KAFKA_SASL_USERS: an entry is not name:password of [A-Za-z0-9._~+=-]"
        echo "$name $password"
    done
}

# The listeners' SASL and TLS settings: PLAIN users in each listener's JAAS config
# (user_<name>="<password>"), SCRAM against the credentials in the metadata log.
secure_properties() {
    local users name password plain_users="" listener
    users="$(sasl_users)" || exit 1
    while read -r name password; do
        plain_users+=" user_$name=\"$password\""
    done <<<"$users"
    local listeners=(sasl_plaintext)
    if with_ssl; then listeners+=(sasl_ssl); fi
    echo "sasl.enabled.mechanisms=$SASL_MECHANISMS"
    for listener in "${listeners[@]}"; do
        echo "listener.name.$listener.sasl.enabled.mechanisms=$SASL_MECHANISMS"
        echo "listener.name.$listener.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$plain_users;"
        echo "listener.name.$listener.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
        echo "listener.name.$listener.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
    done
    if [[ "${NEARDUP_KAFKA_ACLS:-0}" == 1 ]]; then
        echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        echo "super.users=User:ANONYMOUS"
    fi
    if with_ssl; then
        echo "listener.name.sasl_ssl.ssl.keystore.type=PKCS12"
        echo "listener.name.sasl_ssl.ssl.keystore.location=$SSL_KEYSTORE"
        echo "listener.name.sasl_ssl.ssl.keystore.password=$SSL_KEYSTORE_PASSWORD"
        echo "listener.name.sasl_ssl.ssl.client.auth=none"
    fi
    return 0
}

# --add-scram arguments of StorageTool format, one a line: every user, both SCRAM hashes.
scram_args() {
    local users name password
    users="$(sasl_users)" || exit 1
    while read -r name password; do
        printf '%s\n' --add-scram "SCRAM-SHA-256=[name=$name,password=$password]" \
            --add-scram "SCRAM-SHA-512=[name=$name,password=$password]"
    done <<<"$users"
}

extra_ports() {
    if secure; then
        echo "$SASL_PORT"
        if with_ssl; then echo "$SASL_SSL_PORT"; fi
    fi
    return 0
}

print_servers() {
    # NEARDUP_BROKERS is what the worker and the project's tools read; the test suite and
    # the benchmarks read KAFKA_BOOTSTRAP_SERVERS
    echo "NEARDUP_BROKERS=$HOST:$PORT"
    echo "KAFKA_BOOTSTRAP_SERVERS=$HOST:$PORT"
    if secure; then
        echo "KAFKA_SASL_PLAINTEXT_SERVERS=$HOST:$SASL_PORT"
        if with_ssl; then echo "KAFKA_SASL_SSL_SERVERS=$HOST:$SASL_SSL_PORT"; fi
    fi
    return 0
}

# ---------------------------------------------------------------- config

# All broker settings live here; secured mode adds its listeners and their SASL and TLS
# settings (secure_properties).
write_server_properties() {
    local listeners="PLAINTEXT://$HOST:$PORT" protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    [[ "$GROUP_DELAY_MS" =~ ^[0-9]+$ ]] ||
        die "NEARDUP_KAFKA_GROUP_DELAY_MS: a number of milliseconds, not '$GROUP_DELAY_MS'"
    if secure; then
        listeners+=",SASL_PLAINTEXT://$HOST:$SASL_PORT"
        protocols+=",SASL_PLAINTEXT:SASL_PLAINTEXT"
        if with_ssl; then
            [[ -r "$SSL_KEYSTORE" ]] || die "NEARDUP_KAFKA_SSL_KEYSTORE: cannot read $SSL_KEYSTORE"
            listeners+=",SASL_SSL://$HOST:$SASL_SSL_PORT"
            protocols+=",SASL_SSL:SASL_SSL"
        fi
    fi
    # secured mode writes passwords into it: readable by the owner only
    (umask 077 && : >"$PROPS_FILE")
    cat >"$PROPS_FILE" <<EOF
# generated by kafka-local.sh - single-node KRaft (combined mode), loopback only
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$NODE_ID@$HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=$listeners,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=$listeners,CONTROLLER://$HOST:$CONTROLLER_PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$DATA_DIR

# single node: every internal topic has one replica
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1

num.partitions=1
# A raw-page line may be up to 4 x 5 MiB + 64 KiB (neardup/contract.py), as in
# docker-compose.yml; Kafka's default of 1 MiB would refuse ordinary large pages.
message.max.bytes=23068672
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=$GROUP_DELAY_MS
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
EOF
    if secure; then
        secure_properties >>"$PROPS_FILE"
    fi
    return 0
}

write_log4j_config() {
    # log4j2 properties format: needs no YAML/JSON parser on the classpath.
    cat >"$LOG4J_FILE" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.raft.name = org.apache.kafka.raft
logger.raft.level = WARN
EOF
}

# ---------------------------------------------------------------- helpers

java_cp() {
    # Quoted on purpose: the JVM expands "dir/*" itself.
    "$JAVA" "${HEAP_OPTS[@]}" -cp "$LIBS_DIR/*" \
        -Dlog4j2.configurationFile="$LOG4J_FILE" "$@"
}

running_pid() {
    # Prints the broker pid if the pid file names a live kafka.Kafka process.
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # Guard against pid reuse after a crash/reboot.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
    echo "$pid"
}

port_open() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# Readiness probe, stdlib python only. Succeeds when
#  1. a Metadata (v4) request lists this broker, i.e. it is registered and
#     unfenced, and
#  2. FindCoordinator (v1) returns a coordinator for a consumer group and for a
#     transactional id. The first such call makes the broker create
#     __consumer_offsets / __transaction_state, so once this passes, clients do
#     not see a burst of COORDINATOR_NOT_AVAILABLE on their first group join or
#     InitProducerId.
broker_probe() {
    python3 - "$HOST" "$PORT" "$NODE_ID" <<'EOF' 2>/dev/null
import socket, struct, sys
host, port, node_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def call(api_key, version, body, corr=7):
    client = b"kafka-local"
    req = struct.pack(">hhih", api_key, version, corr, len(client)) + client + body
    with socket.create_connection((host, port), timeout=3) as s:
        s.settimeout(3)
        s.sendall(struct.pack(">i", len(req)) + req)
        def read(n):
            buf = b""
            while len(buf) < n:
                chunk = s.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf
        (size,) = struct.unpack(">i", read(4))
        resp = read(size)
    (got,) = struct.unpack_from(">i", resp, 0)
    if got != corr:
        sys.exit(1)
    return resp[4:]

def kstr(b):
    return struct.pack(">h", len(b)) + b

# Metadata v4: topics=null (all), allow_auto_topic_creation=false
resp = call(3, 4, struct.pack(">ib", -1, 0))
_throttle, nbrokers = struct.unpack_from(">ii", resp, 0)
off, ids = 8, []
for _ in range(max(nbrokers, 0)):
    (nid,) = struct.unpack_from(">i", resp, off); off += 4
    (hlen,) = struct.unpack_from(">h", resp, off); off += 2 + hlen + 4
    (rlen,) = struct.unpack_from(">h", resp, off); off += 2 + max(rlen, 0)
    ids.append(nid)
if node_id not in ids:
    sys.exit(1)

# FindCoordinator v1: key, key_type (0 = group, 1 = transaction)
for key_type, key in ((0, b"kafka-local-probe"), (1, b"kafka-local-probe")):
    resp = call(10, 1, kstr(key) + struct.pack(">b", key_type))
    _throttle, error_code = struct.unpack_from(">ih", resp, 0)
    if error_code != 0:
        sys.exit(1)
EOF
}

broker_ready() {
    grep -q 'Kafka Server started' "$LOG_FILE" 2>/dev/null || return 1
    port_open "$PORT" || return 1
    local p
    for p in $(extra_ports); do
        port_open "$p" || return 1
    done
    if command -v python3 >/dev/null 2>&1; then
        broker_probe
    fi
}

# ---------------------------------------------------------------- commands

start() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid)"
        print_servers
        return 0
    fi
    command -v "$JAVA" >/dev/null 2>&1 || die "java ('$JAVA') not found (JDK 17+ needed)"
    if secure; then sasl_users >/dev/null; fi  # fail early on a bad NEARDUP_KAFKA_SASL_USERS
    for p in "$PORT" "$CONTROLLER_PORT" $(extra_ports); do
        if port_open "$p"; then
            die "port $p on $HOST is already in use by another process"
        fi
    done
    fetch

    mkdir -p "$RUN_DIR"
    write_server_properties
    write_log4j_config

    if [[ -f "$DATA_DIR/meta.properties" ]]; then
        log "reusing formatted storage in $DATA_DIR"
    else
        local cluster_id
        cluster_id="$(java_cp kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)"
        [[ -n "$cluster_id" ]] || die "could not generate a cluster id"
        log "formatting $DATA_DIR (cluster id $cluster_id)"
        local scram=()
        if secure; then mapfile -t scram < <(scram_args); fi
        java_cp kafka.tools.StorageTool format -t "$cluster_id" -c "$PROPS_FILE" \
            "${scram[@]}" >"$RUN_DIR/format.log" 2>&1 \
            || { cat "$RUN_DIR/format.log" >&2; die "storage format failed"; }
    fi

    log "starting broker on $HOST:$PORT (controller $HOST:$CONTROLLER_PORT), log: $LOG_FILE"
    : >"$LOG_FILE"
    # setsid + nohup: the broker outlives this shell and its terminal.
    setsid nohup "$JAVA" "${HEAP_OPTS[@]}" -XX:+UseG1GC -Djava.awt.headless=true \
        "${EXTRA_JAVA_OPTS[@]}" \
        -Dlog4j2.configurationFile="$LOG4J_FILE" -Dkafka.logs.dir="$RUN_DIR" \
        -cp "$LIBS_DIR/*" kafka.Kafka "$PROPS_FILE" \
        </dev/null >>"$LOG_FILE" 2>&1 &
    pid=$!
    echo "$pid" >"$PID_FILE"

    local started=$SECONDS deadline=$((SECONDS + START_TIMEOUT))
    until broker_ready; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "broker exited during startup; last log lines:"
            tail -n 40 "$LOG_FILE" >&2
            rm -f "$PID_FILE"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            log "broker not ready after ${START_TIMEOUT}s; last log lines:"
            tail -n 40 "$LOG_FILE" >&2
            stop_pid "$pid"
            rm -f "$PID_FILE"
            exit 1
        fi
        sleep 0.5
    done
    log "ready after $((SECONDS - started)) s (pid $pid)"
    print_servers
}

stop_pid() {
    local pid="$1" deadline=$((SECONDS + STOP_TIMEOUT))
    kill -TERM "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "broker (pid $pid) still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
}

stop() {
    local keep=0 pid
    [[ "${1:-}" == "--keep" ]] && keep=1
    if pid="$(running_pid)"; then
        log "stopping broker (pid $pid)"
        stop_pid "$pid"
        log "stopped"
    else
        log "not running"
    fi
    rm -f "$PID_FILE"
    if ((keep)); then
        log "keeping $RUN_DIR"
    elif [[ -d "$RUN_DIR" ]]; then
        rm -rf "$RUN_DIR"
        log "removed $RUN_DIR"
    fi
}

status() {
    local pid
    if pid="$(running_pid)"; then
        echo "running (pid $pid) on $HOST:$PORT"
    else
        echo "not running"
        return 1
    fi
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

case "${1:-}" in
    fetch) fetch ;;
    start) start ;;
    stop) shift; stop "$@" ;;
    status) status ;;
    env) print_servers | sed 's/^/export /' ;;
    *) usage ;;
esac
