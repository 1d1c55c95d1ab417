# The quantdrift image: worker, gateway, replay, archive and alerts all run from it.
# Two stages: the build stage installs into a virtualenv; the runtime stage copies
# only that virtualenv, runs as an unprivileged user, and keeps its state (Faust's
# data directory, reports) in one writable directory.

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/quantdrift
ENV PATH=/opt/quantdrift/bin:$PATH

# torch first, pinned: 2.13.0 is a CPU build; an unpinned torch pulls a multi-GB CUDA build.
RUN pip install torch==2.13.0

WORKDIR /build
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
# The roles this image runs; not the lab, the embedded broker or the dev tools.
RUN pip install '.[worker,gateway,replay]'


FROM python:3.11-slim AS runtime

# FAUST_DATADIR: Faust writes its data directory there, not beside the code.
# HEALTHCHECK_URL: what HEALTHCHECK probes; the worker's /healthz by default (a gateway
# container sets http://127.0.0.1:8080/health).
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/quantdrift/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    OMP_NUM_THREADS=1 \
    FAUST_DATADIR=/var/lib/quantdrift/faust \
    HEALTHCHECK_URL=http://127.0.0.1:6066/healthz

COPY --from=build /opt/quantdrift /opt/quantdrift

RUN groupadd --system --gid 10001 quantdrift \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/quantdrift --no-create-home quantdrift \
 && mkdir -p /var/lib/quantdrift/faust \
 && chown -R 10001:10001 /var/lib/quantdrift

WORKDIR /var/lib/quantdrift
VOLUME ["/var/lib/quantdrift"]
USER 10001:10001

# 6066: worker status page and /metrics; 8080: gateway.
EXPOSE 6066 8080

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=4 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen(os.environ['HEALTHCHECK_URL'], timeout=3)"]

ENTRYPOINT ["quantdrift"]
CMD ["worker", "--web-port", "6066"]
