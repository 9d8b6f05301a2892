"""A worker's Prometheus metrics: its jobs, its engines' first tokens, and its models' residency.

Served on the worker's own loopback metrics port (`workers.runtime.metrics_server`), with Triton's metrics
appended. Residency, running and waiting jobs are read from the model slots when scraped (the
waiting ones as the controller's last pass read them: the scrape costs no Redis call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from switchboard.metrics import LOAD_BUCKETS, QUEUE_BUCKETS, REGISTRY, TTFT_BUCKETS
from switchboard.wire import SlotState

STATES: tuple[SlotState, ...] = ("cold", "loading", "warm", "sleeping", "unloading")

JOBS = Counter(
    "switchboard:worker_jobs",
    "Jobs a worker took, by model and outcome (finished, failed, aborted, expired, skipped, superseded).",
    ["model", "outcome"],
    registry=REGISTRY,
)
QUEUE_TIME = Histogram(
    "switchboard:request_queue_time_seconds",
    "How long a job waited in its model's queue before a worker took it (model loads included), by "
    "model and the route its request named (empty for none).",
    ["model", "route"],
    buckets=QUEUE_BUCKETS,
    registry=REGISTRY,
)
SLOT_WAIT = Histogram(
    "switchboard:worker_slot_wait_seconds",
    "How long a job waited in line while its model was warm on the worker that took it: the wait for "
    "one of the worker's job slots (its model's share of them), by model.",
    ["model"],
    buckets=QUEUE_BUCKETS,
    registry=REGISTRY,
)
ENGINE_BACKGROUND = Gauge(
    "switchboard:engine_background",
    "1 while the model's engine computes at the background CPU priority (it runs past its share).",
    ["model"],
    registry=REGISTRY,
)
COLD_START_WAIT = Histogram(
    "switchboard:request_cold_start_wait_seconds",
    "For a job that waited for its model to load (or wake): from its enqueue until the model was warm, "
    "by model and route.",
    ["model", "route"],
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)
FIRST_CHUNK = Histogram(
    "switchboard:worker_time_to_first_chunk_seconds",
    "From a worker taking a job to its first result chunk written to Redis.",
    ["model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
ENGINE_FIRST_TOKEN = Histogram(
    "switchboard:engine_time_to_first_token_seconds",
    "From a request handed to the engine (prompt building included) to its first output.",
    ["model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
RESULT_CHUNKS = Counter(
    "switchboard:result_chunks", "Result chunks written to Redis.", ["model"], registry=REGISTRY
)
MODEL_LOADS = Counter(
    "switchboard:model_loads", "Model loads, by model and outcome (ok, failed).", ["model", "outcome"],
    registry=REGISTRY,
)  # fmt: skip
MODEL_LOAD_TIME = Histogram(
    "switchboard:model_load_seconds",
    "How long a model took to load (cold start) on this worker.",
    ["model"],
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)
MODEL_WAKES = Counter(
    "switchboard:model_wakes", "Models woken from sleep, by outcome.", ["model", "outcome"], registry=REGISTRY
)
MODEL_WAKE_TIME = Histogram(
    "switchboard:model_wake_seconds",
    "How long a model took to wake.",
    ["model"],
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)
MODEL_SLEEPS = Counter("switchboard:model_sleeps", "Models put to sleep.", ["model"], registry=REGISTRY)
MODEL_UNLOADS = Counter(
    "switchboard:model_unloads", "Models unloaded (evictions included).", ["model"], registry=REGISTRY
)
ENGINES_ENDED = Counter(
    "switchboard:worker_engines_ended",
    "Engines that could no longer generate (their process killed, out of memory, crashed); each "
    "model was unloaded, to load again on demand.",
    ["model"],
    registry=REGISTRY,
)
MODEL_EVICTIONS = Counter(
    "switchboard:model_evictions",
    "Models unloaded to make room for another model.",
    ["model"],
    registry=REGISTRY,
)
MODEL_FETCHES = Counter(
    "switchboard:model_fetches",
    "A remote model's files asked of the node cache before a load or a prefetch, by outcome: fetched "
    "from its store, cached (on this node already, or fetched by another worker here), failed.",
    ["model", "outcome"],
    registry=REGISTRY,
)
MODEL_FETCH_BYTES = Counter(
    "switchboard:model_fetch_bytes", "Bytes of model files fetched from their stores.", ["model"],
    registry=REGISTRY,
)  # fmt: skip
MODEL_FETCH_TIME = Histogram(
    "switchboard:model_fetch_seconds",
    "How long fetching a remote model's files into the node cache took.",
    ["model"],
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)

CONTROLLER_PASS_TIME = Histogram(
    "switchboard:controller_pass_seconds",
    "How long one pass of a worker's model controller took (its Redis reads and its decision).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
CONTROLLER_PASSES = Counter(
    "switchboard:controller_passes",
    "Passes of a worker's model controller, by what started them (tick, or a poke about a model it may hold).",
    ["trigger"],
    registry=REGISTRY,
)


class SlotCollector(Collector):
    """Residency, running jobs and memory of each model slot of the workers in this process, read
    when scraped (a process holds one worker; tests hold several)."""

    def __init__(self) -> None:
        self._workers: dict[str, Mapping[str, Any]] = {}

    def add(self, worker_id: str, slots: Mapping[str, Any]) -> None:
        """Report the slots of a worker that started."""
        self._workers[worker_id] = slots

    def remove(self, worker_id: str) -> None:
        """A worker stopped; idempotent."""
        self._workers.pop(worker_id, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        resident = GaugeMetricFamily(
            "switchboard:model_resident",
            "1 for the state each model is in on this worker (cold, loading, warm, sleeping, unloading).",
            labels=["model", "worker", "state"],
        )
        running = GaugeMetricFamily(
            "switchboard:num_requests_running",
            "Jobs running on this worker, by model.",
            labels=["model", "worker"],
        )
        waiting = GaugeMetricFamily(
            "switchboard:worker_jobs_waiting",
            "Jobs on each model's stream that no worker has taken yet, as this worker last read them.",
            labels=["model", "worker"],
        )
        memory = GaugeMetricFamily(
            "switchboard:model_memory_bytes",
            "What each model held here occupies (0 when cold).",
            labels=["model", "worker"],
        )
        download_done = GaugeMetricFamily(
            "switchboard:model_download_bytes_done",
            "Bytes of a remote model's files in the node cache so far, while a load here fetches them.",
            labels=["model", "worker"],
        )
        download_total = GaugeMetricFamily(
            "switchboard:model_download_bytes_total",
            "Bytes of a remote model's files, while a load here fetches them.",
            labels=["model", "worker"],
        )
        for worker_id, slots in list(self._workers.items()):
            for name, slot in slots.items():
                for state in STATES:
                    resident.add_metric([name, worker_id, state], 1.0 if slot.state == state else 0.0)
                running.add_metric([name, worker_id], float(slot.in_flight))
                waiting.add_metric([name, worker_id], float(getattr(slot, "jobs_waiting", 0)))
                memory.add_metric([name, worker_id], float(_memory(slot)))
                download = getattr(slot, "download", None)
                if download is not None:
                    download_done.add_metric([name, worker_id], float(download.bytes_done))
                    download_total.add_metric([name, worker_id], float(download.bytes_total))
        yield resident
        yield running
        yield waiting
        yield memory
        yield download_done
        yield download_total

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without samples, so that registering reads no slot."""
        yield GaugeMetricFamily("switchboard:model_resident", "", labels=["model", "worker", "state"])
        yield GaugeMetricFamily("switchboard:num_requests_running", "", labels=["model", "worker"])
        yield GaugeMetricFamily("switchboard:worker_jobs_waiting", "", labels=["model", "worker"])
        yield GaugeMetricFamily("switchboard:model_memory_bytes", "", labels=["model", "worker"])
        yield GaugeMetricFamily("switchboard:model_download_bytes_done", "", labels=["model", "worker"])
        yield GaugeMetricFamily("switchboard:model_download_bytes_total", "", labels=["model", "worker"])


SLOTS = SlotCollector()
REGISTRY.register(SLOTS)


def _memory(slot: Any) -> int:
    try:
        return int(slot.memory_bytes())
    except Exception:  # an engine between states cannot always tell; the gauge is not worth failing
        return 0
