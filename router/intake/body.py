"""Request bodies: JSON only, decoded once by a prebuilt msgspec decoder, every failure a 4xx.

Hostile bodies must never reach a 500: invalid UTF-8 inside a string, nesting deep enough to exhaust
the decoder's recursion, or a body that is not JSON at all each get a 400 saying what is wrong; a
body sent as anything but JSON gets a 415; its size is bounded by Litestar (413), and what it holds
(messages, tools, schemas, grammars, ...) by the front door's request bounds (`router.openai.bounds`),
checked as soon as it is decoded.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request

from router.openai.bounds import check_chat_bounds, check_sampling_bounds
from router.openai.chat import ChatCompletionRequest
from router.openai.common import SamplingRequest
from router.openai.errors import InvalidRequestError, UnsupportedMediaTypeError, from_validation_error
from switchboard.router_config import RouterConfig

T = TypeVar("T")


async def decode_body(request: Request[Any, Any, Any], decoder: msgspec.json.Decoder[T]) -> T:
    """The request's JSON body as the decoder's type, within the front door's request bounds, or the
    4xx that says what is wrong with it."""
    require_json(request)
    decoded = _decoded(await request.body(), decoder)
    check_bounds(decoded, _router_settings(request))
    return decoded


def check_bounds(decoded: Any, bounds: RouterConfig) -> None:
    """Refuse (400) a generation request past one of the bounds on what a request may hold."""
    if isinstance(decoded, ChatCompletionRequest):
        check_chat_bounds(decoded, bounds)
    elif isinstance(decoded, SamplingRequest):
        check_sampling_bounds(decoded, bounds)


def _router_settings(request: Request[Any, Any, Any]) -> RouterConfig:
    """The front door's router settings (`router.front_door.FrontDoor`, kept in the app's state)."""
    settings: RouterConfig = request.app.state.front_door.settings.router
    return settings


def _decoded(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
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
