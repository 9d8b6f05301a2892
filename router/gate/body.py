"""Request bodies: JSON only, decoded once by a prebuilt msgspec decoder, every failure a 4xx.

Hostile bodies must never reach a 500: invalid UTF-8 inside a string, nesting deep enough to exhaust
the decoder's recursion, or a body that is not JSON at all each get a 400 saying what is wrong; a
body sent as anything but JSON gets a 415. Its size is bounded while it is read (413, and the
budgets of bodies in flight: `router.http.body_budget`); what it holds, by its gate's checks.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request

from router.openai.errors import InvalidRequestError, UnsupportedMediaTypeError, from_validation_error

T = TypeVar("T")


def decoded(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """`body` as the decoder's type, or the 400 that says what is wrong with it."""
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation_error(exc) from None
    except UnicodeDecodeError:
        raise InvalidRequestError(
            "The request body is not valid UTF-8; JSON text must be UTF-8.", code="invalid_json"
        ) from None
    except RecursionError:
        raise InvalidRequestError(
            "The request body's JSON is nested too deeply.", code="invalid_json"
        ) from None


def require_json(request: Request[Any, Any, Any]) -> None:
    """Refuse (415) a body whose Content-Type is not JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    shown = f"`{media_type}`" if media_type else "no Content-Type"
    raise UnsupportedMediaTypeError(
        f"The request body was sent with {shown}; send JSON with `Content-Type: application/json`."
    )
