# syntax=docker/dockerfile:1
# A worker for models with `engine = "trtllm"`: PyTriton with TensorRT-LLM (its `LLM` API, PyTorch
# backend), on NVIDIA's TensorRT-LLM release container. Built from the repository root:
#   docker build -f deploy/docker/worker-trtllm.Dockerfile -t switchboard/worker-trtllm .
#
# Why NVIDIA's container: TensorRT-LLM's wheels are built against NVIDIA's own torch, CUDA,
# TensorRT and MPI. The `tensorrt-llm` on PyPI is a stub that downloads the real wheel from NVIDIA's
# index while it installs. The 1.2.1 release container is NVIDIA's build of TensorRT-LLM 1.2.1 on
# nvcr.io/nvidia/pytorch:25.12-py3 (Ubuntu 24.04, Python 3.12, CUDA 13, torch
# 2.10.0a0+b4e4ee81d3.nv25.12, transformers 4.57). We add Switchboard and PyTriton beside it, in a
# virtual environment that sees the container's packages, and hold every package the container
# ships at its version (a constraint file written from the container itself): nothing we install
# may move what TensorRT-LLM was built and tested with, and a conflict fails the build instead of
# breaking the engine at run time.
#
# No vLLM in this image: vLLM pins the public torch wheel of its release, and the vLLM that
# Switchboard runs pins torch and transformers versions other than this container's (TensorRT-LLM
# 1.2.1 pins transformers 4.57). Models with `engine = "vllm"` run on the worker-gpu image; the
# GPU check (deploy/gpu-check/) adds vLLM in an environment of its own to run both on one GPU.
#
# Otherwise as the other images: two stages, uv, bytecode compiled at install, a non-root user,
# tini as PID 1. The base's own entrypoint (NVIDIA's environment set-up and checks) runs after tini
# and hands over to the command.
ARG TRTLLM_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1

FROM ${TRTLLM_IMAGE} AS build
# The container's packages as they are, before anything is added: the versions to hold.
# uv with the hashes scripts/install.sh checks (scripts/uv-requirements.txt).
COPY scripts/uv-requirements.txt /tmp/uv-requirements.txt
RUN python3 -m pip list --format=freeze --disable-pip-version-check > /tmp/trtllm-environment.txt \
    && python3 -m pip install --no-cache-dir --target /opt/uv --require-hashes -r /tmp/uv-requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY switchboard switchboard
COPY router router
COPY workers workers
ENV UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy
# --system-site-packages: the environment sees TensorRT-LLM, torch and the rest where the container
# put them. uv does not count those as installed, so what Switchboard and PyTriton need is installed
# into the environment too, at the container's versions (the constraints).
# The worker's own Triton backend (workers/triton/native_backend.py), built into the package.
RUN (command -v cc >/dev/null || (apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev)) \
    && python3 -m workers.triton.native_backend
RUN /opt/uv/bin/uv venv --system-site-packages --python python3 /opt/switchboard \
    && cp /tmp/trtllm-environment.txt /opt/switchboard/trtllm-environment.txt \
    && /opt/uv/bin/uv pip install --python /opt/switchboard/bin/python --no-cache --compile-bytecode \
        --constraint /opt/switchboard/trtllm-environment.txt \
        . nvidia-pytriton==0.7.0 h2==4.4.1

FROM ${TRTLLM_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
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
# Models under /models (mounted read-only); downloads and compile caches under ~/.cache (a volume).
# The node cache of models in buckets and on the Hub: a volume at the folder compose and the
# manifests name in SWITCHBOARD_WORKER__MODEL_CACHE_DIR, owned by the worker's user so that a new
# volume mounted there is writable.
VOLUME ["/home/switchboard/.cache", "/var/cache/switchboard/models"]
# tini passes SIGTERM on and reaps (TensorRT-LLM's MPI worker is a child of the worker); NVIDIA's
# entrypoint sets up the CUDA environment of its container, then execs the command.
ENTRYPOINT ["tini", "--", "/opt/nvidia/nvidia_entrypoint.sh"]
CMD ["switchboard", "worker"]
