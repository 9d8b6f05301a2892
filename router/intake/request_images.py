"""The images one chat request sends: found in its messages at its gate, taken by its model or refused.

At the gate (`images_of`), each `image_url` part, in the order of the messages and their parts, is
either a `data:` URL, decoded and checked there (`router.intake.images`), or an `http(s)` URL, refused
there unless the operator allows remote images (`router.image_urls`). Once the request's model is
known, an image sent to a model that takes none is a 400 naming the model (`check_images_taken`),
and the remote ones are fetched (`fetched_images`, `router.intake.image_fetch`), once per request
however many models its fallbacks and pipeline steps try. The job carries them in that same order: a message's `parts` name
them by index (`router.intake.job`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from router.intake.image_fetch import ImageUrlPolicy, fetch_image
from router.intake.images import ImageBounds, check_count, check_total, image_from_url
from router.openai.chat import ChatCompletionRequest
from router.openai.errors import ModelTakesNoImagesError
from switchboard.config import FrontDoorConfig
from switchboard.wire import ImageInput

REMOTE_SCHEMES = ("http://", "https://")


@dataclass(frozen=True, slots=True)
class RemoteImage:
    """An image part whose URL the front door fetches once the request's model is known."""

    url: str
    param: str


RequestImage = ImageInput | RemoteImage


def images_of(chat: ChatCompletionRequest, settings: FrontDoorConfig) -> tuple[RequestImage, ...]:
    """The images of `chat`'s messages in order: data URLs checked, remote ones allowed (400s)."""
    bounds = ImageBounds.of(settings)
    images: list[RequestImage] = []
    for position, message in enumerate(chat.messages):
        if isinstance(message.content, str) or message.content is None:
            continue
        for index, part in enumerate(message.content):
            image = part.image
            if part.type != "image_url" or image is None:
                continue
            param = f"messages[{position}].content[{index}].image_url"
            check_count(len(images) + 1, param=param, bounds=bounds)
            images.append(_request_image(image.url, param, settings, bounds))
    check_total([image for image in images if isinstance(image, ImageInput)], param="messages", bounds=bounds)
    return tuple(images)


def _request_image(url: str, param: str, settings: FrontDoorConfig, bounds: ImageBounds) -> RequestImage:
    if url.lower().startswith(REMOTE_SCHEMES) and settings.image_urls != "off":
        return RemoteImage(url=url, param=param)
    return image_from_url(url, param=param, bounds=bounds)


def check_images_taken(images: tuple[RequestImage, ...], *, model: str, takes_images: bool | None) -> None:
    """A 400 naming `model` if `images` are sent to it and it takes none (None: not known here; the
    worker that loads it decides)."""
    if images and takes_images is False:
        raise ModelTakesNoImagesError(model)


async def fetched_images(
    images: tuple[RequestImage, ...], settings: FrontDoorConfig
) -> tuple[ImageInput, ...]:
    """`images` as a job carries them, the remote ones fetched side by side, all within the bounds."""
    if not any(isinstance(image, RemoteImage) for image in images):
        return tuple(image for image in images if isinstance(image, ImageInput))
    bounds = ImageBounds.of(settings)
    policy = ImageUrlPolicy.from_setting(
        settings.image_urls,
        connect_timeout_s=settings.image_fetch_connect_timeout_s,
        total_timeout_s=settings.image_fetch_timeout_s,
    )
    fetched = await asyncio.gather(*(_fetched(image, policy, bounds) for image in images))
    check_total(fetched, param="messages", bounds=bounds)
    return tuple(fetched)


async def _fetched(image: RequestImage, policy: ImageUrlPolicy, bounds: ImageBounds) -> ImageInput:
    if isinstance(image, ImageInput):
        return image
    return await fetch_image(image.url, param=image.param, policy=policy, bounds=bounds)
