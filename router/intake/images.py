"""The images a request sends, checked at the front door before anything is queued.

A chat message's `image_url` part (and the Responses API's `input_image`) carries its image as a
`data:` URL (`data:image/png;base64,...`); its bytes are decoded here and bounded: how many images a
request sends, the bytes of each and of all, and the pixels of each. The pixels are read from the
image's header, before any of it is decoded, so an image that would decode to gigabytes (a
decompression bomb) is refused for what it says it is; the header and the file's structure are then
checked (`verify`), so that bytes which are no image of an allowed format are a 400 here rather than
an engine error on a worker. The worker decodes the image in full.

Every refusal is a 400 in OpenAI's shape that names the part at fault and the bound it passed.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence

import msgspec

from router.openai.errors import InvalidRequestError
from switchboard.config import FrontDoorConfig
from switchboard.wire import ImageInput

# The formats taken, by the name PIL gives them: what vision models' processors read.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


class ImageBounds(msgspec.Struct, frozen=True, kw_only=True):
    """What one request may send as images (the front door's `max_image*` settings)."""

    max_images: int = 8
    max_image_bytes: int = 10 * 1024 * 1024
    max_total_bytes: int = 20 * 1024 * 1024
    # 4096 x 4096: more than any vision model's processor keeps (they resize far below it).
    max_pixels: int = 4096 * 4096

    @classmethod
    def of(cls, settings: FrontDoorConfig) -> ImageBounds:
        return cls(
            max_images=settings.max_images_per_request,
            max_image_bytes=settings.max_image_bytes,
            max_total_bytes=settings.max_images_bytes,
            max_pixels=settings.max_image_pixels,
        )


def image_from_url(url: str, *, param: str, bounds: ImageBounds) -> ImageInput:
    """The image of a `data:` URL, checked; a 400 for any other URL (remote ones are fetched by
    `router.intake.image_fetch` where the operator allows them)."""
    if url.lower().startswith(("http://", "https://")):
        raise _invalid(
            param,
            "Image URLs are not fetched here: the operator has not allowed remote images "
            "(`router.image_urls`). Send the image inline as a `data:image/...;base64,...` URL.",
            code="image_url_not_allowed",
        )
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise _invalid(
            param,
            f"Image URLs of scheme `{scheme}` are not taken; send the image inline as a "
            "`data:image/...;base64,...` URL (or, where the operator allows it, an https URL).",
            code="invalid_image_url",
        )
    header, _, payload = url.partition(",")
    media, _, encoding = header[len("data:") :].rpartition(";")
    if encoding != "base64" or not media.startswith("image/"):
        raise _invalid(
            param, "A data URL's image must be base64: `data:image/png;base64,...`.", code="invalid_image_url"
        )
    if len(payload) * 3 // 4 > bounds.max_image_bytes:
        raise _too_large(param, len(payload) * 3 // 4, bounds)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(param, "The data URL's base64 does not decode.", code="invalid_image_url") from None
    return checked_image(data, param=param, bounds=bounds)


def checked_image(data: bytes, *, param: str, bounds: ImageBounds) -> ImageInput:
    """`data` as an image of an allowed format and size; a 400 naming `param` otherwise."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > bounds.max_image_bytes:
        raise _too_large(param, len(data), bounds)
    try:
        with Image.open(io.BytesIO(data)) as image:  # the header only: nothing is decoded yet
            kind, (width, height) = image.format, image.size
            if kind not in FORMATS:
                raise _invalid(
                    param,
                    f"Images of format {kind} are not taken; send {', '.join(FORMATS)}.",
                    code="invalid_image",
                )
            if width * height > bounds.max_pixels:
                raise _invalid(
                    param,
                    f"The image is {width}x{height} pixels, more than the {bounds.max_pixels:,} an image "
                    "may have here; send it smaller.",
                    code="image_too_large",
                )
            image.verify()
    except Image.DecompressionBombError:
        # PIL's own guard, at twice its limit: the header says so many pixels that it would not open.
        raise _invalid(
            param,
            f"The image says it has far more than the {bounds.max_pixels:,} pixels an image may have here.",
            code="image_too_large",
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise _invalid(param, "The bytes are no image that can be read.", code="invalid_image") from None
    return ImageInput(media_type=FORMATS[kind], data=data, width=width, height=height)


def check_count(count: int, *, param: str, bounds: ImageBounds) -> None:
    """A 400 unless a request of `count` images is within the request's bound."""
    if count > bounds.max_images:
        raise _invalid(
            param,
            f"The request sends {count} or more images; at most {bounds.max_images} are taken per request.",
            code="too_many_images",
        )


def check_total(images: Sequence[ImageInput], *, param: str, bounds: ImageBounds) -> None:
    """A 400 unless the request's images together are within the request's bounds."""
    check_count(len(images), param=param, bounds=bounds)
    total = sum(len(image.data) for image in images)
    if total > bounds.max_total_bytes:
        raise _invalid(
            param,
            f"The request's images are {total:,} bytes together; at most {bounds.max_total_bytes:,} are "
            "taken per request.",
            code="image_too_large",
        )


def _too_large(param: str, size: int, bounds: ImageBounds) -> InvalidRequestError:
    return _invalid(
        param,
        f"The image is {size:,} bytes; at most {bounds.max_image_bytes:,} are taken per image.",
        code="image_too_large",
    )


def _invalid(param: str, message: str, *, code: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)
