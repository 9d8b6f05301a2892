"""Images checked at the front door (router/intake/images.py): data URLs decoded, formats read from
their bytes, and every bound a 400 naming the part, a decompression bomb refused by its header."""

from __future__ import annotations

import struct
import zlib

import pytest

from router.intake.images import ImageBounds, check_total, checked_image, image_from_url
from router.openai.errors import InvalidRequestError
from tests.support.images import data_url, encoded

PARAM = "messages[0].content[1].image_url.url"
BOUNDS = ImageBounds(
    max_images=2, max_image_bytes=64 * 1024, max_total_bytes=100 * 1024, max_pixels=512 * 512
)


def refused(call: object) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.param == PARAM
    return caught.value


@pytest.mark.parametrize(
    ("kind", "media"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_a_data_url_gives_the_image_its_bytes_say(kind: str, media: str) -> None:
    data = encoded(kind=kind)
    image = image_from_url(data_url(data, "image/png"), param=PARAM, bounds=BOUNDS)  # the bytes decide
    assert (image.media_type, image.width, image.height, image.data) == (media, 32, 24, data)


def test_what_is_no_data_url_of_an_image_is_refused() -> None:
    # A remote URL reaches this only where the operator allows none (`router.image_urls` "off").
    assert refused(lambda: image_from_url("https://example.com/a.png", param=PARAM, bounds=BOUNDS)).code == (
        "image_url_not_allowed"
    )
    assert "`data:image/...;base64" in str(
        refused(lambda: image_from_url("file:///etc/passwd", param=PARAM, bounds=BOUNDS))
    )
    assert (
        refused(lambda: image_from_url("data:text/plain;base64,aGk=", param=PARAM, bounds=BOUNDS)).code
        == "invalid_image_url"
    )
    assert (
        refused(lambda: image_from_url("data:image/png;base64,@@@", param=PARAM, bounds=BOUNDS)).code
        == "invalid_image_url"
    )
    assert (
        refused(lambda: image_from_url(data_url(b"GIF89a not really"), param=PARAM, bounds=BOUNDS)).code
        == "invalid_image"
    )
    truncated = encoded(noise=True)[:-40]
    assert refused(lambda: checked_image(truncated, param=PARAM, bounds=BOUNDS)).code == "invalid_image"
    bmp = encoded(kind="BMP")
    assert "format BMP" in str(refused(lambda: checked_image(bmp, param=PARAM, bounds=BOUNDS)))


def test_bytes_and_pixels_past_their_bounds_are_refused() -> None:
    big = encoded(200, 200, noise=True)  # about 120 KB: past 64 KiB
    assert (
        refused(lambda: image_from_url(data_url(big), param=PARAM, bounds=BOUNDS)).code == "image_too_large"
    )
    wide = encoded(600, 400)  # small bytes, 240,000 pixels: within; 1024x1024 is not
    assert checked_image(wide, param=PARAM, bounds=BOUNDS).width == 600
    assert "1024x1024 pixels" in str(
        refused(lambda: checked_image(encoded(1024, 1024), param=PARAM, bounds=BOUNDS))
    )


def test_a_decompression_bomb_is_refused_by_its_header_before_any_decoding() -> None:
    # A PNG that says it is 100,000 x 100,000 pixels in a few hundred bytes.
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b"")
    )
    error = refused(lambda: checked_image(bomb, param=PARAM, bounds=BOUNDS))
    assert error.code == "image_too_large" and "pixels" in str(error)
    # One just past the bound but far below PIL's own guard: refused by the size its header gives.
    header = struct.pack(">IIBBBBB", 600, 500, 8, 2, 0, 0, 0)
    over = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b"")
    )
    assert "600x500 pixels" in str(refused(lambda: checked_image(over, param=PARAM, bounds=BOUNDS)))


def test_a_requests_images_are_bounded_together() -> None:
    one = checked_image(encoded(noise=True), param=PARAM, bounds=BOUNDS)
    check_total([one, one], param=PARAM, bounds=BOUNDS)
    assert refused(lambda: check_total([one] * 3, param=PARAM, bounds=BOUNDS)).code == "too_many_images"
    heavy = checked_image(encoded(180, 110, noise=True), param=PARAM, bounds=BOUNDS)
    assert len(heavy.data) * 2 > BOUNDS.max_total_bytes
    assert refused(lambda: check_total([heavy, heavy], param=PARAM, bounds=BOUNDS)).code == "image_too_large"
