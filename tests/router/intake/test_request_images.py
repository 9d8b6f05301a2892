"""A chat request's images (router/intake/request_images.py): found in order at the gate, data URLs
checked there, remote ones refused unless allowed, refused to a model that takes none, and fetched
once the model is known."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from router.intake.job import chat_job
from router.intake.request_images import RemoteImage, check_images_taken, fetched_images, images_of
from router.openai.chat import ChatCompletionRequest
from router.openai.errors import InvalidRequestError
from switchboard.config import FrontDoorConfig
from switchboard.wire import ImageInput, encode, job_decoder
from tests.support.images import data_url, encoded

RED = data_url(encoded(8, 6))
NOISE = data_url(encoded(16, 12, noise=True))


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def chat(*messages: dict[str, Any]) -> ChatCompletionRequest:
    body = {"model": "vlm", "messages": list(messages)}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def refused(call: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        call()
    return caught.value


TWO_MESSAGES = chat(
    {"role": "system", "content": "Describe."},
    {"role": "user", "content": [{"type": "text", "text": "first"}, image_part(RED)]},
    {"role": "assistant", "content": "A red square."},
    # The URL alone, as vLLM's server also takes it.
    {
        "role": "user",
        "content": [{"type": "image_url", "image_url": NOISE}, {"type": "text", "text": "and?"}],
    },
)


def test_images_are_found_in_the_order_of_messages_and_parts() -> None:
    images = images_of(TWO_MESSAGES, FrontDoorConfig())
    assert [(image.width, image.height) for image in images if isinstance(image, ImageInput)] == [
        (8, 6),
        (16, 12),
    ]


def test_the_job_names_each_image_by_its_index_in_its_messages_parts() -> None:
    images = images_of(TWO_MESSAGES, FrontDoorConfig())
    job = chat_job(TWO_MESSAGES, timeout_s=10, images=images)  # type: ignore[arg-type]
    job = job_decoder.decode(encode(job))  # as a worker reads it from Redis
    assert [message.parts for message in job.messages or ()] == [(), ("first", 0), (), (1, "and?")]
    assert [message.content for message in job.messages or ()] == [
        "Describe.",
        "first",
        "A red square.",
        "and?",
    ]
    assert [image.data for image in job.images] == [image.data for image in images]  # type: ignore[union-attr]


def test_a_text_only_chat_job_carries_no_parts() -> None:
    job = chat_job(chat({"role": "user", "content": [{"type": "text", "text": "hi"}]}), timeout_s=10)
    assert job.messages is not None and job.messages[0].parts == () and job.images == ()


def test_more_images_than_a_request_may_send_are_refused_at_the_first_too_many() -> None:
    settings = FrontDoorConfig(max_images_per_request=2)
    request = chat({"role": "user", "content": [image_part(RED)] * 3})
    error = refused(lambda: images_of(request, settings))
    assert (error.code, error.param) == ("too_many_images", "messages[0].content[2].image_url")


def test_the_images_together_are_bounded() -> None:
    settings = FrontDoorConfig(max_images_bytes=1024, max_image_bytes=1024)
    request = chat({"role": "user", "content": [image_part(NOISE)] * 2})
    assert refused(lambda: images_of(request, settings)).code in ("image_too_large",)


def test_remote_urls_are_refused_at_the_gate_unless_the_operator_allows_them() -> None:
    request = chat({"role": "user", "content": [image_part("https://images.example.com/cat.png")]})
    error = refused(lambda: images_of(request, FrontDoorConfig()))
    assert (error.code, error.param) == ("image_url_not_allowed", "messages[0].content[0].image_url")
    allowed = images_of(request, FrontDoorConfig(image_urls=["images.example.com"]))
    assert allowed == (
        RemoteImage(url="https://images.example.com/cat.png", param="messages[0].content[0].image_url"),
    )


def test_an_image_to_a_model_that_takes_none_is_refused_naming_it() -> None:
    images = images_of(TWO_MESSAGES, FrontDoorConfig())
    error = refused(lambda: check_images_taken(images, model="tiny-text", takes_images=False))
    assert (error.code, error.param) == ("model_takes_no_images", "messages")
    assert "`tiny-text`" in error.message
    # Not known at the front door (a model in a store, never loaded): the worker decides.
    check_images_taken(images, model="remote", takes_images=None)
    check_images_taken((), model="tiny-text", takes_images=False)


def test_a_remote_image_is_fetched_through_the_policy_once_the_model_is_known() -> None:
    # Allowed at the gate by "public", then refused by the fetch for what its host resolves to.
    settings = FrontDoorConfig(image_urls="public")
    request = chat({"role": "user", "content": [image_part(RED), image_part("http://127.0.0.1:9/a.png")]})
    images = images_of(request, settings)
    error = refused(lambda: asyncio.run(fetched_images(images, settings)))
    assert (error.code, error.param) == ("image_url_not_allowed", "messages[0].content[1].image_url")
    only_inline = images_of(chat({"role": "user", "content": [image_part(RED)]}), settings)
    assert asyncio.run(fetched_images(only_inline, settings)) == only_inline
