"""The keep-alive ladder, as the policy, the worker's heartbeat and the status page read it."""

from __future__ import annotations

import pytest

from switchboard.keep_alive import idle_limit_s, leaves_at, never_leaves
from switchboard.wire import SlotState


@pytest.mark.parametrize(
    ("state", "keep_alive_s", "asleep_keep_alive_s", "limit_s"),
    [
        ("warm", 300.0, 1800.0, 300.0),
        ("warm", 0.0, 1800.0, 0.0),
        ("warm", -1.0, 1800.0, None),
        ("warm", 300.0, -1.0, 300.0),
        ("sleeping", 300.0, 1800.0, 2100.0),
        ("sleeping", 300.0, -1.0, None),
        ("sleeping", -1.0, 1800.0, None),
        ("loading", 300.0, 1800.0, None),
        ("unloading", 300.0, 1800.0, None),
        ("cold", 300.0, 1800.0, None),
    ],
)
def test_idle_limit_per_rung(
    state: SlotState, keep_alive_s: float, asleep_keep_alive_s: float, limit_s: float | None
) -> None:
    assert idle_limit_s(state, keep_alive_s, asleep_keep_alive_s) == limit_s


def _leaves_at(
    state: SlotState = "warm", idle_since: float | None = 1000.0, **settings: float
) -> float | None:
    values = {"keep_alive_s": 300.0, "asleep_keep_alive_s": 1800.0, "in_flight": 0, "min_replicas": 0}
    values.update(settings)
    return leaves_at(
        state,
        idle_since,
        keep_alive_s=values["keep_alive_s"],
        asleep_keep_alive_s=values["asleep_keep_alive_s"],
        in_flight=int(values["in_flight"]),
        min_replicas=int(values["min_replicas"]),
    )


def test_leaves_at_counts_from_the_last_job() -> None:
    assert _leaves_at("warm") == 1300.0
    assert _leaves_at("sleeping") == 3100.0


def test_leaves_at_is_none_while_busy_unknown_or_held() -> None:
    assert _leaves_at(in_flight=1) is None
    assert _leaves_at(idle_since=None) is None
    assert _leaves_at(min_replicas=1) is None
    assert _leaves_at(keep_alive_s=-1) is None
    assert _leaves_at("sleeping", asleep_keep_alive_s=-1) is None
    assert _leaves_at("loading") is None


@pytest.mark.parametrize(
    ("state", "keep_alive_s", "asleep_keep_alive_s", "min_replicas", "never"),
    [
        ("warm", -1.0, 1800.0, 0, True),
        ("warm", 300.0, -1.0, 0, False),
        # The status page reads the model's own rung: asleep, only asleep_keep_alive_s counts.
        ("sleeping", -1.0, 1800.0, 0, False),
        ("sleeping", 300.0, -1.0, 0, True),
        ("warm", 300.0, 1800.0, 1, True),
        ("loading", 300.0, 1800.0, 1, True),
        ("loading", -1.0, -1.0, 0, False),
        ("warm", 300.0, 1800.0, 0, False),
    ],
)
def test_never_leaves_reads_the_own_rung(
    state: SlotState, keep_alive_s: float, asleep_keep_alive_s: float, min_replicas: int, never: bool
) -> None:
    assert (
        never_leaves(
            state,
            keep_alive_s=keep_alive_s,
            asleep_keep_alive_s=asleep_keep_alive_s,
            min_replicas=min_replicas,
        )
        is never
    )
