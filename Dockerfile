# The quantdrift image: worker, gateway, replay, archive and alerts all run from it.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    OMP_NUM_THREADS=1

WORKDIR /app

# torch first, pinned: 2.13.0 is a CPU build; an unpinned torch pulls a multi-GB CUDA build.
RUN pip install torch==2.13.0

COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install '.[report]'

RUN useradd --system --uid 10001 --home /app quantdrift
USER quantdrift

# 6066: worker status page and /metrics; 8080: gateway.
EXPOSE 6066 8080
ENTRYPOINT ["quantdrift"]
CMD ["worker", "--web-port", "6066"]
