"""Images the tests send: small encoded pictures made with PIL, and their data URLs."""

from __future__ import annotations

import base64
import io

from PIL import Image


def encoded(width: int = 32, height: int = 24, kind: str = "PNG", noise: bool = False) -> bytes:
    """A `width` x `height` picture in format `kind`: solid red, or (`noise`) random grey pixels,
    so that two of them look nothing alike."""
    image = (
        Image.effect_noise((width, height), 64).convert("RGB")
        if noise
        else Image.new("RGB", (width, height), (200, 30, 30))
    )
    out = io.BytesIO()
    image.save(out, format=kind)
    return out.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"
