# The two commands of the README: `make up` runs the product, `make test` runs the whole suite.
.PHONY: install install-bench lock up test lint typecheck docs unit e2e clients bench bench-cold bench-scale bench-clients bench-cpu bench-router bench-triton bench-fair bench-front-door bench-embeddings bench-sources bench-adapters bench-images bench-batch gpu-check clean

VENV := .venv/bin

install:
	@scripts/install.sh

# The benchmarks also need pyproject.toml's `bench` group (LiteLLM's proxy, py-spy). Every bench target
# installs it, so going from one benchmark to another installs nothing; `make install` (and so
# `make test`) removes it again.
install-bench:
	@scripts/install.sh bench

# After changing a dependency in pyproject.toml: write uv.lock anew (commit it; every install uses it).
lock:
	@scripts/lock.sh

up: install
	@$(VENV)/switchboard up

lint: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

typecheck: install
	$(VENV)/mypy

test: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy
	$(VENV)/mkdocs build --strict --quiet
	$(VENV)/pytest

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails the build on a broken link or
# anchor. The configuration reference is written from the settings structs as it builds.
docs: install
	$(VENV)/mkdocs build --strict --quiet

unit: install
	$(VENV)/pytest -m "not e2e"

e2e: install
	$(VENV)/pytest -m e2e

# Third-party clients as they are (openai SDKs for Python and Node, LangChain, LiteLLM, vllm bench serve).
clients: install
	$(VENV)/pytest tests/clients

bench: install-bench
	$(VENV)/python bench/path_overhead.py

bench-cold: install-bench
	$(VENV)/python bench/cold_start.py

bench-scale: install-bench
	$(VENV)/python bench/scale.py

# Where the path's CPU goes: per process and thread, per request and per streamed chunk, with profiles.
bench-cpu: install-bench
	$(VENV)/python bench/path_cpu.py --profile

# What the hop through the worker's Triton costs, against calling the same Triton model in process.
bench-triton: install-bench
	$(VENV)/python bench/triton_hop.py

# What a router pipeline's choice adds to the time to first token, against calling the target directly.
bench-router: install-bench
	$(VENV)/python bench/router_model.py

# One model floods a worker: the quiet model's time to first token beside it, fair shares on and off.
bench-fair: install-bench
	$(VENV)/python bench/fair_share.py

# The front door's share of the path without an engine: time to first byte, its CPU and Redis commands per request.
bench-front-door: install-bench
	$(VENV)/python bench/front_door_path.py --profile

# An embedder with Triton's dynamic batcher on and off, and behind vLLM's own server (--runner pooling).
bench-embeddings: install-bench
	$(VENV)/python bench/embeddings.py

# Cold first token of a model in a bucket (a real S3 API on loopback), in the node cache, in a local folder;
# vLLM's own server given the same s3:// path (Run:ai's streamer).
bench-sources: install-bench
	$(VENV)/python bench/model_sources.py

# LoRA adapters on one base (Zipf popularity, Poisson arrivals) against the base alone, the same fine-tunes
# merged into whole models, and vLLM's own server with runtime LoRA loading.
bench-adapters: install-bench
	$(VENV)/python bench/adapters.py

# Chat requests with an image against text-only ones, on Switchboard and on vLLM's own server, with a
# tiny vision-language model: what each path adds to the time to first token (bench/images.py).
bench-images: install-bench
	$(VENV)/python bench/images.py

# Interactive clients at a steady rate alone, beside a 10,000-line Batch API batch, and the batch alone
# (bench/batch.py): the interactive time to first token, and the share of spare capacity the batch uses.
bench-batch: install-bench
	$(VENV)/python bench/batch.py

# vLLM's own load generator (`vllm bench serve`) against Switchboard and vLLM's server, side by side.
bench-clients: install-bench
	$(VENV)/python bench/vllm_bench_serve.py

# The GPU check (tests/gpu; docs/trtllm.md, "The GPU check"). On a machine with an
# NVIDIA GPU, Docker and the NVIDIA Container Toolkit: builds the TensorRT-LLM worker image and the
# check's image on it (deploy/gpu-check/), then runs `pytest -m gpu tests/gpu` inside, on GPU $(GPU)
# alone, with this tree mounted read-only. Where TensorRT-LLM is importable already (inside that
# image, or a machine of your own with it and a GPU): the same pytest, in place.
# SWITCHBOARD_GPU_MODEL=/path/to/hf-model-folder serves that model instead of the demo model;
# SWITCHBOARD_GPU_ENGINE_ARGS='{"max_batch_size": 8}' changes the TensorRT-LLM engine arguments.
GPU ?= 0
SWITCHBOARD_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TRTLLM_WORKER_IMAGE ?= switchboard/worker-trtllm:$(SWITCHBOARD_VERSION)
GPU_CHECK_IMAGE ?= switchboard/gpu-check:$(SWITCHBOARD_VERSION)

gpu-check:
	@if python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("tensorrt_llm") is None)' 2>/dev/null; then \
		echo "TensorRT-LLM is importable here: running the GPU check in place"; \
		python3 -m pytest -p no:cacheprovider -s -m gpu tests/gpu; \
	else \
		docker build -f deploy/docker/worker-trtllm.Dockerfile -t $(TRTLLM_WORKER_IMAGE) . && \
		docker build -f deploy/gpu-check/Dockerfile --build-arg WORKER_IMAGE=$(TRTLLM_WORKER_IMAGE) \
			-t $(GPU_CHECK_IMAGE) . && \
		docker run --rm --gpus device=$(GPU) --shm-size 8g --ulimit memlock=-1 --ulimit stack=67108864 \
			-v "$(CURDIR):/src:ro" -e SWITCHBOARD_GPU_ENGINE_ARGS \
			$(if $(SWITCHBOARD_GPU_MODEL),-v "$(abspath $(SWITCHBOARD_GPU_MODEL)):/models/gpu-check:ro" -e SWITCHBOARD_GPU_MODEL=/models/gpu-check) \
			$(GPU_CHECK_IMAGE); \
	fi

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
