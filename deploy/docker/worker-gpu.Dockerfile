# syntax=docker/dockerfile:1
# A worker on an NVIDIA GPU: PyTriton with vLLM's GPU build. The CUDA libraries come with the
# wheels (torch, vLLM); the host gives the driver (NVIDIA Container Toolkit).
#   docker build -f deploy/docker/worker-gpu.Dockerfile -t switchboard/worker-gpu .
# Installed the way scripts/install.sh installs the `gpu` extra: uv, exactly what uv.lock records
# (hashes checked), bytecode compiled at install. The base image's digest pin:
# deploy/images.lock (scripts/pin-images.sh).
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
    && uv sync --locked --no-editable --no-cache --compile-bytecode --extra gpu

FROM ${PYTHON_IMAGE}
# gcc and the C headers: Triton (the kernel compiler vLLM uses) builds small launchers at run time.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini libnuma1 gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin switchboard \
    && install -d -o 10001 -g 10001 /home/switchboard/.cache /models /var/cache/switchboard/models
COPY --from=build /opt/switchboard /opt/switchboard
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /home/switchboard
# The node cache of models in buckets and on the Hub: a volume at the folder compose and the
# manifests name in SWITCHBOARD_WORKER__MODEL_CACHE_DIR, owned by the worker's user so that a new
# volume mounted there is writable.
VOLUME ["/home/switchboard/.cache", "/var/cache/switchboard/models"]
ENTRYPOINT ["tini", "--"]
CMD ["switchboard", "worker"]
