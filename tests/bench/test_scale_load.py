"""The scale benchmark's choice of models (`bench/scale_load.py`)."""

from __future__ import annotations

import random
from collections import Counter

from scale_load import Zipf

MODELS = [f"m{i}" for i in range(100)]


def test_zipf_asks_for_the_most_popular_models_most() -> None:
    zipf = Zipf(MODELS, 1.1, random.Random(7))
    counts = Counter(zipf.draw() for _ in range(5000))
    assert counts["m0"] > counts["m1"] > counts["m9"] > counts["m99"]
    # Rank 1 against rank 2 is 2^1.1 (about 2.1) to one.
    assert 1.7 < counts["m0"] / counts["m1"] < 2.6


def test_the_same_seed_draws_the_same_models() -> None:
    first, second = Zipf(MODELS, 1.1, random.Random(3)), Zipf(MODELS, 1.1, random.Random(3))
    assert [first.draw() for _ in range(50)] == [second.draw() for _ in range(50)]
