# syntax=docker/dockerfile:1
# The neardup Kafka worker. Build: docker build -t neardup .
# Every third-party dependency with native code (numpy, rjieba, rocksdict, opencc,
# selectolax, lxml, aiokafka) ships a manylinux wheel whose only system
# libraries (libc, libstdc++, libgcc_s, zlib) are already in the slim image, and jieba is
# pure Python; so neither of the last two stages installs apt packages or a compiler.
# The first builds neardup's wheel with its Rust module (native/) inside, on the same
# Debian release, with Debian's Python 3.11 (the module is abi3, for CPython >= 3.11).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUST_IMAGE=rust:1-slim-bookworm

FROM ${RUST_IMAGE} AS wheel
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/wheel
WORKDIR /src
# README.md is the package's readme in pyproject.toml: hatchling will not build without it.
COPY pyproject.toml README.md hatch_build.py ./
COPY schemas ./schemas
COPY neardup ./neardup
COPY native/Cargo.toml native/Cargo.lock ./native/
COPY native/src ./native/src
# pip builds it with hatchling, fetched from PyPI, whose build hook (hatch_build.py) runs
# cargo on native/ with the crates pinned by native/Cargo.lock, fetched from crates.io.
# NEARDUP_EXPECT_NATIVE=1: a wheel without the module fails the build instead.
RUN NEARDUP_EXPECT_NATIVE=1 /opt/wheel/bin/pip wheel --no-cache-dir --no-deps . -w /wheels

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/neardup
WORKDIR /src
# requirements.lock: the versions the tests ran with and scripts/audit.sh audited.
COPY requirements.lock ./
COPY --from=wheel /wheels /wheels
RUN /opt/neardup/bin/pip install "$(ls /wheels/neardup-*.whl)[kafka]" -c requirements.lock \
    && /opt/neardup/bin/python -c "import neardup.settings, neardup.produce, rocksdict, rjieba" \
    && /opt/neardup/bin/python -c "import neardup; assert neardup.fingerprint_path() == 'native'"

FROM ${PYTHON_IMAGE}
# A fixed numeric uid lets Kubernetes check runAsNonRoot without looking inside the image.
RUN groupadd --system --gid 10001 neardup \
    && useradd --system --uid 10001 --gid neardup --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin neardup \
    && install -d -o neardup -g neardup -m 0750 /var/lib/neardup
COPY --from=build /opt/neardup /opt/neardup
# The producer service of docker-compose.yml loads this; it is part of the repository.
COPY examples/sample.jsonl /usr/share/neardup/sample.jsonl
# jieba writes its dictionary cache to the temp dir and other libraries write under $HOME;
# both point at /tmp, which stays writable under a read-only root filesystem (the Helm
# chart mounts an emptyDir there).
ENV PATH=/opt/neardup/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    NEARDUP_HTTP_HOST=0.0.0.0 \
    NEARDUP_HTTP_PORT=8080 \
    NEARDUP_STATE_DIR=/var/lib/neardup
USER 10001:10001
# The state directory is also the working directory, so anything a library writes
# relative to it lands on the volume.
WORKDIR /var/lib/neardup
VOLUME /var/lib/neardup
EXPOSE 8080
# No curl in the slim image; urlopen raises (exit 1) on a refused connection or non-2xx.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('NEARDUP_HTTP_PORT', '8080'), timeout=4)"]
# No -l: the worker logs at NEARDUP_LOG_LEVEL, which a -l here would override.
CMD ["python", "-m", "neardup.kafka", "worker"]
