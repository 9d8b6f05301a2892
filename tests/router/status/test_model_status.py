"""Model status from worker records (pure: `summarize` on recorded values, no Redis)."""

from __future__ import annotations

import pytest

from router.relay.first_byte import describe_wait
from router.status.model_status import ModelStatus, summarize
from switchboard.config import ModelConfig
from switchboard.wire import LoadFailure, SlotState, SlotStatus, WorkerRecord

NOW = 1_000_000.0
MODEL = ModelConfig(name="tiny", path="/x")


def record(worker_id: str, *slots: SlotStatus, kind: str = "cpu") -> WorkerRecord:
    return WorkerRecord(
        id=worker_id,
        host=f"{worker_id}-host",
        pid=1,
        started=NOW - 100,
        heartbeat=NOW,
        models=(),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
        kind=kind,
        slots=slots,
    )


def slot(state: SlotState, replica: int = 0, model: str = "tiny", **fields: float | int | None) -> SlotStatus:
    return SlotStatus(model=model, state=state, replica=replica, **fields)  # type: ignore[arg-type]


def status(
    *records: WorkerRecord,
    model: ModelConfig = MODEL,
    waiting: int = 0,
    failure: LoadFailure | None = None,
    samples: dict[str, list[float]] | None = None,
) -> ModelStatus:
    return summarize(model, records, waiting=waiting, failure=failure, load_samples=samples or {}, now=NOW)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ((), "cold"),
        (("sleeping", "loading"), "loading"),
        (("unloading", "warm", "loading"), "warm"),
        (("unloading", "sleeping"), "sleeping"),
        (("unloading",), "unloading"),
        (("cold",), "cold"),
    ],
)
def test_a_model_is_as_ready_as_its_best_replica(states: tuple[SlotState, ...], expected: str) -> None:
    records = [record(f"w{i}", slot(state, replica=i)) for i, state in enumerate(states)]
    assert status(*records).state == expected


def test_other_models_and_cold_slots_are_not_replicas() -> None:
    result = status(record("w1", slot("warm", model="other"), slot("cold")))
    assert result.replicas == []
    assert result.state == "cold"


def test_replicas_sort_by_number_and_sum_their_work() -> None:
    result = status(
        record("w2", slot("warm", replica=1, in_flight=3, idle_since=NOW - 5)),
        record("w1", slot("warm", replica=0, idle_since=NOW - 40, leaves_at=NOW + 20)),
    )
    assert [(r.worker_id, r.replica) for r in result.replicas] == [("w1", 0), ("w2", 1)]
    assert result.in_flight == 3
    assert [r.idle_s for r in result.replicas] == [40.0, 0.0]
    assert result.idle_s == 0.0
    # One replica is busy (no leaves_at): the model as a whole does not leave.
    assert result.leaves_in_s is None
    assert result.never_leaves is False


def test_the_model_leaves_when_its_last_replica_does() -> None:
    result = status(
        record("w1", slot("warm", replica=0, idle_since=NOW - 40, leaves_at=NOW + 20)),
        record("w2", slot("sleeping", replica=1, idle_since=NOW - 400, leaves_at=NOW + 900)),
    )
    assert result.leaves_in_s == 900.0
    assert result.idle_s == 40.0


@pytest.mark.parametrize(
    ("config", "state", "never"),
    [
        (ModelConfig(name="tiny", path="/x", keep_alive_s=-1), "warm", True),
        (ModelConfig(name="tiny", path="/x", keep_alive_s=-1), "sleeping", False),
        (ModelConfig(name="tiny", path="/x", asleep_keep_alive_s=-1), "sleeping", True),
        (ModelConfig(name="tiny", path="/x", min_replicas=1), "warm", True),
        (ModelConfig(name="tiny", path="/x", min_replicas=1), "loading", False),
        (MODEL, "warm", False),
    ],
)
def test_never_leaves_follows_the_configuration(config: ModelConfig, state: SlotState, never: bool) -> None:
    assert status(record("w1", slot(state)), model=config).never_leaves is never


def test_load_seconds_per_kind() -> None:
    result = status(samples={"cpu": [30.0, 10.0, 20.0, 90.0], "H100": [4.0]})
    assert result.load_seconds["cpu"].last == 30.0
    assert result.load_seconds["cpu"].typical == 25.0
    assert result.load_seconds["cpu"].samples == 4
    assert result.typical_load_s() == 4.0


def test_load_remaining_prefers_what_the_loading_replica_expects() -> None:
    loading = record("w1", slot("loading", load_started=NOW - 10, expected_load_s=50.0))
    assert status(loading, samples={"cpu": [80.0]}).load_remaining_s() == 40.0
    unknown = record("w1", slot("loading", load_started=NOW - 10))
    assert status(unknown, samples={"cpu": [80.0]}).load_remaining_s() == 70.0
    assert status(unknown).load_remaining_s() is None
    assert status(samples={"cpu": [80.0]}).load_remaining_s() == 80.0
    assert status().load_remaining_s() is None


def test_a_failure_says_when_it_is_retried() -> None:
    failure = LoadFailure(model="tiny", worker_id="w1", reason="oom", failed_at=NOW - 5, retry_at=NOW + 12)
    result = status(failure=failure)
    assert result.failure is not None
    assert (result.failure.reason, result.failure.retry_in_s, result.failure.worker_id) == ("oom", 12.0, "w1")
    assert describe_wait(result) == "tiny failed to load: oom; retrying in 12 s (0 jobs queued)"


@pytest.mark.parametrize(
    ("slots", "waiting", "text"),
    [
        ((), 1, "waiting for a worker to load tiny (1 job queued)"),
        (
            (slot("loading", load_started=NOW - 12.4, expected_load_s=49.8),),
            3,
            "loading tiny, 12 s of about 50 s",
        ),
        ((slot("loading", load_started=NOW - 2),), 3, "loading tiny, 2 s of about ?"),
        ((slot("warm", in_flight=4),), 2, "waiting for tiny (2 jobs queued, 4 running)"),
        ((slot("sleeping"),), 2, "waiting for tiny to wake (2 jobs queued)"),
        (
            (slot("warm", in_flight=1), slot("loading", replica=1)),
            5,
            "waiting for tiny (5 jobs queued, 1 running)",
        ),
        ((slot("unloading"),), 0, "waiting for tiny, which is being unloaded (0 jobs queued)"),
    ],
)
def test_progress_wording(slots: tuple[SlotStatus, ...], waiting: int, text: str) -> None:
    assert describe_wait(status(record("w1", *slots), waiting=waiting)) == text


def test_each_replica_tells_the_jobs_its_worker_counted_waiting_for_it() -> None:
    summary = status(
        record("w1", slot("warm", in_flight=2, waiting=5)), record("w2", slot("warm", replica=1)), waiting=5
    )
    assert [(r.worker_id, r.in_flight, r.waiting) for r in summary.replicas] == [("w1", 2, 5), ("w2", 0, 0)]
