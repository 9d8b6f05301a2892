# syntax=docker/dockerfile:1
# A worker on a machine without a GPU: PyTriton with vLLM's CPU build on torch's CPU build.
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t switchboard/worker-cpu .
# Installed the way scripts/install.sh installs the `cpu` extra: uv, exactly what uv.lock records
# (hashes checked; pyproject.toml's overrides: numpy<2 for PyTriton, no torchvision/torchaudio),
# torch's CPU wheel from PyTorch's CPU index and nothing else from there (the lock names one index
# per package), bytecode compiled at install (an engine start imports vLLM three times over
# without it). The base image's digest pin: deploy/images.lock (scripts/pin-images.sh).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# gcc: the worker's own Triton backend (workers/triton/native_backend.py) is built here, into the package.
# uv with the hashes scripts/install.sh checks (scripts/uv-requirements.txt).
COPY scripts/uv-requirements.txt /tmp/uv-requirements.txt
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python -m pip install --no-cache-dir --require-hashes -r /tmp/uv-requirements.txt
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY switchboard switchboard
COPY router router
COPY workers workers
ENV UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/switchboard
RUN python -m workers.triton.native_backend \
    && uv venv --python /usr/local/bin/python /opt/switchboard \
    && uv sync --locked --no-editable --no-cache --compile-bytecode --extra cpu

FROM ${PYTHON_IMAGE}
# libnuma: vLLM's CPU kernels place memory per NUMA node.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin switchboard \
    && install -d -o 10001 -g 10001 /home/switchboard/.cache /models /var/cache/switchboard/models
COPY --from=build /opt/switchboard /opt/switchboard
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/switchboard
# Models under /models (mounted read-only); downloads and compile caches under ~/.cache (a volume).
# The node cache of models in buckets and on the Hub: a volume at the folder compose and the
# manifests name in SWITCHBOARD_WORKER__MODEL_CACHE_DIR, owned by the worker's user so that a new
# volume mounted there is writable.
VOLUME ["/home/switchboard/.cache", "/var/cache/switchboard/models"]
# tini passes SIGTERM on and reaps; the worker drains its jobs and ends Triton and its engines.
ENTRYPOINT ["tini", "--"]
CMD ["switchboard", "worker"]
