"""router.admission.fits: refusing at the front door what cannot fit a model, once its limits are known."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.admission import fits as model_limits
from router.admission.fits import (
    ModelLimitsCache,
    RequestSize,
    check_fits,
    check_images_fit,
    check_job_fits,
    size_of,
)
from router.openai.errors import InvalidRequestError
from switchboard import keys
from switchboard.wire import ChatMessage, ImageInput, Job, ModelLimits, SamplingParams, ToolCall, encode

LIMITS = ModelLimits(max_model_len=100, vocab_size=500, max_token_chars=8)
LONGEST_TEXT = 100 * 8


def size(**fields: Any) -> RequestSize:
    return RequestSize(**{"prompt_param": "prompt", "prompt_chars": 10, "max_tokens": None, **fields})


def job(model: str = "m", **fields: Any) -> Job:
    now = time.time()
    sampling = fields.pop("sampling", SamplingParams())
    if "messages" not in fields and "prompts" not in fields:
        fields["prompts"] = ("Once",)
    return Job(id="j", model=model, sampling=sampling, created=now, deadline=now + 60, **fields)


def refused(limits: ModelLimits, request: RequestSize) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        check_fits(limits, request)
    assert caught.value.status_code == 400
    return caught.value


@pytest.mark.parametrize(
    "request_size",
    [
        size(prompt_chars=LONGEST_TEXT),
        size(prompt_tokens=99),
        size(max_tokens=99),
        size(token_ids=[0, 499]),
        size(logit_bias={0: 1.0, 499: -100.0}),
        size(prompt_param="messages", prompt_chars=0),
    ],
)
def test_what_could_fit_passes(request_size: RequestSize) -> None:
    check_fits(LIMITS, request_size)


@pytest.mark.parametrize(
    ("request_size", "param", "code"),
    [
        (size(prompt_chars=LONGEST_TEXT + 1), "prompt", "context_length_exceeded"),
        (size(prompt_param="messages", prompt_chars=LONGEST_TEXT + 1), "messages", "context_length_exceeded"),
        (size(prompt_tokens=100), "prompt", "context_length_exceeded"),
        (size(prompt_tokens=5000), "prompt", "context_length_exceeded"),
        (size(max_tokens=100), "max_tokens", "context_length_exceeded"),
        (size(prompt_param="messages", max_tokens=2**31 - 1), "max_tokens", "context_length_exceeded"),
        (size(token_ids=[1, 2, 500]), "prompt", "invalid_value"),
        (size(logit_bias={3: 1.0, 7000: 1.0}), "logit_bias", "invalid_value"),
    ],
)
def test_what_cannot_fit_is_refused(request_size: RequestSize, param: str, code: str) -> None:
    error = refused(LIMITS, request_size)
    assert (error.param, error.code) == (param, code)


def test_messages_say_what_was_asked() -> None:
    error = refused(LIMITS, size(prompt_param="messages", prompt_chars=LONGEST_TEXT + 1))
    assert "100 tokens" in error.message
    assert f"{LONGEST_TEXT + 1} characters" in error.message
    assert "`messages`" in error.message
    error = refused(LIMITS, size(max_tokens=150))
    assert "150" in error.message
    error = refused(LIMITS, size(token_ids=[900, 501, 700, 501, 600, 800, 1000]))
    assert "0 to 499" in error.message
    # The first few ids outside, sorted and without repeats.
    assert "[501, 600, 700, 800, 900]" in error.message


def test_size_of_a_chat_job() -> None:
    messages = (
        ChatMessage(role="system", content="abc"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="c", name="f", arguments="{}"),)),
        ChatMessage(role="user", content="defgh"),
    )
    sampling = SamplingParams(max_tokens=12, logit_bias={7: 1.0})
    measured = size_of(job(messages=messages, sampling=sampling))
    assert measured.prompt_param == "messages"
    assert measured.prompt_chars == 8
    assert measured.prompt_tokens == 0
    assert measured.token_ids == []
    assert measured.max_tokens == 12
    assert measured.logit_bias == {7: 1.0}


def test_size_of_a_completion_job() -> None:
    prompts = ("ab", (1, 2, 3), "abcdef", (4,))
    measured = size_of(job(prompts=prompts, sampling=SamplingParams(max_tokens=3)))
    assert measured.prompt_param == "prompt"
    # Each prompt is a request of its own: the longest is what must fit.
    assert measured.prompt_chars == 6
    assert measured.prompt_tokens == 3
    assert sorted(measured.token_ids) == [1, 2, 3, 4]
    assert measured.max_tokens == 3
    assert measured.logit_bias == {}


def test_size_of_token_prompts_only() -> None:
    measured = size_of(job(prompts=((9, 9),)))
    assert (measured.prompt_chars, measured.prompt_tokens, measured.token_ids) == (0, 2, [9, 9])


async def publish(redis: aioredis.Redis, model: str, limits: ModelLimits) -> None:
    await redis.set(keys.model_limits(model), encode(limits))


async def test_unknown_limits_check_nothing(redis: aioredis.Redis) -> None:
    cache = ModelLimitsCache(redis)
    assert await cache.get("m") is None
    absurd = job(prompts=("x" * 100_000, (10**6,)), sampling=SamplingParams(max_tokens=10**9))
    await check_job_fits(cache, absurd)


async def test_published_limits_are_checked(redis: aioredis.Redis) -> None:
    await publish(redis, "m", LIMITS)
    cache = ModelLimitsCache(redis)
    assert await cache.get("m") == LIMITS
    await check_job_fits(cache, job(sampling=SamplingParams(max_tokens=99)))
    with pytest.raises(InvalidRequestError) as caught:
        await check_job_fits(cache, job(sampling=SamplingParams(max_tokens=100)))
    assert (caught.value.param, caught.value.code) == ("max_tokens", "context_length_exceeded")
    with pytest.raises(InvalidRequestError) as caught:
        await check_job_fits(cache, job(messages=(ChatMessage(role="user", content="y" * 801),)))
    assert caught.value.param == "messages"
    with pytest.raises(InvalidRequestError) as caught:
        await check_job_fits(cache, job(prompts=("ok", (1, 500))))
    assert (caught.value.param, caught.value.code) == ("prompt", "invalid_value")


async def test_limits_are_per_model(redis: aioredis.Redis) -> None:
    await publish(redis, "small", LIMITS)
    cache = ModelLimitsCache(redis)
    await check_job_fits(cache, job(model="other", sampling=SamplingParams(max_tokens=10_000)))
    with pytest.raises(InvalidRequestError):
        await check_job_fits(cache, job(model="small", sampling=SamplingParams(max_tokens=10_000)))


async def test_limits_are_cached(redis: aioredis.Redis) -> None:
    await publish(redis, "m", LIMITS)
    cache = ModelLimitsCache(redis)
    assert await cache.get("m") == LIMITS
    bigger = ModelLimits(max_model_len=4096, vocab_size=32000, max_token_chars=16)
    await publish(redis, "m", bigger)
    assert await cache.get("m") == LIMITS


async def test_absence_is_cached_too(redis: aioredis.Redis) -> None:
    cache = ModelLimitsCache(redis)
    assert await cache.get("m") is None
    await publish(redis, "m", LIMITS)
    assert await cache.get("m") is None


async def test_limits_are_read_again_once_stale(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_limits, "CACHE_S", 0.0)
    cache = ModelLimitsCache(redis)
    assert await cache.get("m") is None
    await publish(redis, "m", LIMITS)
    assert await cache.get("m") == LIMITS
    await redis.delete(keys.model_limits("m"))
    assert await cache.get("m") is None


IMAGE = ImageInput(media_type="image/png", data=b"png", width=56, height=56)


def test_images_fit_by_the_fewest_tokens_the_model_makes_of_one() -> None:
    vision = ModelLimits(max_model_len=100, vocab_size=500, max_token_chars=8, min_image_tokens=20)
    check_images_fit(vision, job(images=(IMAGE,) * 4, sampling=SamplingParams(max_tokens=20)))
    with pytest.raises(InvalidRequestError) as caught:
        check_images_fit(vision, job(images=(IMAGE,) * 4, sampling=SamplingParams(max_tokens=21)))
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "messages")
    assert "4 images take at least 80 tokens" in caught.value.message
    with pytest.raises(InvalidRequestError) as caught:
        check_images_fit(vision, job(images=(IMAGE,) * 5))
    assert caught.value.code == "context_length_exceeded"


def test_images_to_a_model_whose_workers_say_it_takes_none_are_refused() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_images_fit(LIMITS, job(model="text-only", images=(IMAGE,)))
    assert caught.value.code == "model_takes_no_images" and "`text-only`" in caught.value.message
    check_images_fit(LIMITS, job(model="text-only"))
