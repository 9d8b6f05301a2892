# syntax=docker/dockerfile:1
# A worker for models with `engine = "trtllm"`: PyTriton with TensorRT-LLM (its `LLM` API).
#   docker build -f deploy/docker/worker-trtllm.Dockerfile -t switchboard/worker-trtllm .
# The TensorRT-LLM engine adapter is not in the product yet (workers/engines/registry.py refuses
# such models with a clear error); this image is what it will run in. TensorRT-LLM's wheels need
# CUDA's runtime and MPI from the base image, and Python 3.12 on Ubuntu 24.04.
# Installed the way scripts/install.sh installs: uv, pyproject.toml, bytecode compiled at install.
ARG CUDA_IMAGE=nvidia/cuda:12.9.1-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-dev python3-pip libopenmpi-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m pip install --no-cache-dir --break-system-packages uv==0.13.8
WORKDIR /src
COPY pyproject.toml README.md ./
COPY switchboard switchboard
COPY router router
COPY workers workers
ENV UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy
RUN uv venv --python /usr/bin/python3.12 /opt/switchboard \
    && uv pip install --python /opt/switchboard/bin/python --no-cache --compile-bytecode \
        . nvidia-pytriton==0.7.0 tensorrt-llm==1.2.1

FROM ${CUDA_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini python3.12 libpython3.12 libopenmpi3t64 \
    && rm -rf /var/lib/apt/lists/* \
    && (userdel --remove ubuntu 2>/dev/null || true) \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin switchboard \
    && install -d -o 10001 -g 10001 /home/switchboard/.cache /models
COPY --from=build /opt/switchboard /opt/switchboard
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/switchboard
VOLUME ["/home/switchboard/.cache"]
ENTRYPOINT ["tini", "--"]
CMD ["switchboard", "worker"]
