"""The share of a worker's free job slots each warm model may take on one read (`workers.jobs.shares`)."""

from __future__ import annotations

from collections import Counter

import pytest

from workers.jobs.shares import ModelDemand, allot

SLOTS = 64


def model(name: str, running: int = 0, *, batch: int = SLOTS, **fields: object) -> ModelDemand:
    return ModelDemand(name=name, running=running, room=max(0, batch - running), **fields)  # type: ignore[arg-type]


def test_one_idle_model_may_take_every_free_slot() -> None:
    assert allot(SLOTS, [model("a")], total=SLOTS) == {"a": SLOTS}


def test_a_flooding_model_leaves_a_slot_for_the_quiet_one() -> None:
    flooder, quiet = model("flood", 60, hungry=True), model("quiet")
    assert allot(4, [flooder, quiet], total=SLOTS) == {"quiet": 1, "flood": 3}
    # The last free slot is the quiet model's, however long the flood.
    assert allot(1, [model("flood", 63, hungry=True), quiet], total=SLOTS) == {"quiet": 1}


def test_a_quiet_model_below_its_share_keeps_a_slot_for_its_next_job() -> None:
    flooder, quiet = model("flood", 60, hungry=True), model("quiet", 3)
    assert allot(1, [flooder, quiet], total=SLOTS) == {"quiet": 1}
    # At its share, it has no reserve: it holds its 32 slots.
    assert allot(1, [flooder, model("quiet", 32)], total=SLOTS) == {"flood": 1}


def test_with_free_slots_every_model_is_read_even_at_its_share() -> None:
    # A closed loop of 32 clients: its model at its share, nothing known to wait. Left out of the
    # read, its next job would wait for the read's timeout.
    assert allot(32, [model("flood", 32), model("quiet", 0)], total=SLOTS) == {"quiet": 31, "flood": 1}
    # Scarce, the slots still go to the reserves first.
    assert allot(1, [model("flood", 32), model("quiet", 0)], total=SLOTS) == {"quiet": 1}


def test_the_reads_never_take_more_than_the_free_slots() -> None:
    models = [model(name, running, hungry=name != "c") for name, running in (("a", 10), ("b", 0), ("c", 1))]
    for free in range(0, 20):
        assert sum(allot(free, models, total=SLOTS).values()) == free


def test_a_model_takes_no_more_than_its_engine_batches() -> None:
    small = model("small", 6, batch=8, hungry=True)
    assert allot(SLOTS, [small], total=SLOTS) == {"small": 2}
    assert allot(SLOTS, [model("full", 8, batch=8, hungry=True)], total=SLOTS) == {}


def test_idle_models_split_the_free_slots_evenly() -> None:
    assert allot(SLOTS, [model("a"), model("b")], total=SLOTS) == {"a": 32, "b": 32}


def test_hungry_models_share_slots_in_proportion_to_their_weights() -> None:
    heavy, light = model("heavy", weight=3.0, hungry=True), model("light", weight=1.0, hungry=True)
    assert allot(SLOTS, [heavy, light], total=SLOTS) == {"heavy": 48, "light": 16}
    # Slots freed one at a time go to the model furthest below its share.
    assert allot(
        1, [model("heavy", 45, weight=3.0, hungry=True), model("light", 16, hungry=True)], total=SLOTS
    ) == {"heavy": 1}


def test_the_higher_priority_takes_the_scarce_slots_but_the_lower_keeps_its_reserve() -> None:
    urgent = model("urgent", 10, priority=1, hungry=True)
    batch = model("batch", 0, hungry=True)
    assert allot(20, [batch, urgent], total=SLOTS) == {"urgent": 19, "batch": 1}
    assert allot(20, [model("batch", 1, hungry=True), urgent], total=SLOTS) == {"urgent": 20}


@pytest.mark.parametrize("fair", [True, False])
def test_ties_fall_to_each_model_in_turn(fair: bool) -> None:
    models = [model("a", 10, hungry=True), model("b", 10, hungry=True)]
    firsts = Counter(next(iter(allot(1, models, total=SLOTS, turn=turn, fair=fair))) for turn in range(10))
    assert firsts == {"a": 5, "b": 5}


def test_without_fair_shares_the_slots_go_round_in_turn() -> None:
    flooder, quiet = model("flood", 63, batch=256, hungry=True), model("quiet")
    assert allot(4, [flooder, quiet], total=SLOTS, fair=False) == {"flood": 2, "quiet": 2}
    # No reserve: the last slot goes to whoever's turn it is.
    assert allot(1, [flooder, quiet], total=SLOTS, turn=0, fair=False) == {"flood": 1}
    assert sum(allot(7, [model("small", 6, batch=8), quiet], total=SLOTS, fair=False).values()) == 7
