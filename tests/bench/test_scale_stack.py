"""Which models each simulated worker may hold (`bench/scale_stack.py`)."""

from __future__ import annotations

from scale_stack import allowed_models, model_names


def test_every_worker_may_hold_every_model_by_default() -> None:
    assert allowed_models(3, 10, 0) == [[], [], []]
    assert allowed_models(3, 10, 10) == [[], [], []]


def test_subsets_cover_every_model_and_spread_the_popular_ones() -> None:
    allowed = allowed_models(4, 10, 3)
    assert {name for models in allowed for name in models} == set(model_names(10))
    assert all(len(models) == 3 for models in allowed)
    assert [models[0] for models in allowed] == ["m0000", "m0001", "m0002", "m0003"]


def test_too_small_a_subset_grows_until_the_workers_cover_every_model() -> None:
    allowed = allowed_models(2, 10, 1)
    assert {name for models in allowed for name in models} == set(model_names(10))
