"""The pace of a model's streams, and the tokens an engine output may hold because of it."""

from __future__ import annotations

import pytest

from workers.triton.generator.token_pace import MAX_HELD_TOKENS, StreamPace, TokenPace


def test_nothing_is_held_before_a_pace_is_measured() -> None:
    assert TokenPace().output_every(0.2) == 1


def test_half_a_window_of_tokens_is_held() -> None:
    pace = TokenPace()
    pace.observe(10, 0.1)  # 10 ms a token
    assert pace.output_every(0.2) == 10
    assert pace.output_every(0.03) == 1, "less than two tokens fit in half the window"
    assert pace.output_every(0.0) == 1, "no window, nothing held"


def test_a_fast_stream_holds_at_most_the_cap() -> None:
    pace = TokenPace()
    pace.observe(100, 0.01)
    assert pace.output_every(1.0) == MAX_HELD_TOKENS


def test_the_pace_follows_new_measurements_smoothly() -> None:
    pace = TokenPace()
    pace.observe(1, 0.01)
    for _ in range(50):
        pace.observe(1, 0.02)
    assert pace.seconds_per_token == pytest.approx(0.02, rel=0.01)
    pace.observe(1, 0.04)
    assert 0.02 < (pace.seconds_per_token or 0) < 0.03, "one slow gap moves it a little"


def test_empty_or_instant_gaps_are_not_measured() -> None:
    pace = TokenPace()
    pace.observe(0, 0.01)
    pace.observe(3, 0.0)
    assert pace.seconds_per_token is None


def test_a_streams_first_chunk_only_starts_its_count() -> None:
    pace = TokenPace()
    stream = StreamPace(pace, now=0.0)
    stream.chunk(1, now=0.5)  # the prefill's wait is not a token's pace
    assert pace.seconds_per_token is None
    stream.chunk(5, now=0.54)
    assert pace.seconds_per_token == pytest.approx(0.01)
