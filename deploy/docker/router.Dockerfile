# syntax=docker/dockerfile:1
# The front door (Litestar + msgspec): no engine, no GPU. Built from the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t switchboard/router .
# Installed the way scripts/install.sh installs: uv, exactly what uv.lock records (hashes checked,
# each package from the one index the lock names), bytecode compiled at install (every start would
# compile the sources otherwise). The base image's digest pin: deploy/images.lock
# (scripts/pin-images.sh).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# uv with the hashes scripts/install.sh checks (scripts/uv-requirements.txt).
COPY scripts/uv-requirements.txt /tmp/uv-requirements.txt
RUN python -m pip install --no-cache-dir --require-hashes -r /tmp/uv-requirements.txt
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY switchboard switchboard
COPY router router
COPY workers workers
ENV UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/switchboard
RUN uv venv --python /usr/local/bin/python /opt/switchboard \
    && uv sync --locked --no-editable --no-cache --compile-bytecode

FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin switchboard
COPY --from=build /opt/switchboard /opt/switchboard
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SWITCHBOARD_ROUTER__HOST=0.0.0.0
USER 10001:10001
WORKDIR /home/switchboard
EXPOSE 8000
# tini passes SIGTERM on and reaps; `switchboard router` drains its requests on it.
ENTRYPOINT ["tini", "--"]
CMD ["switchboard", "router"]
