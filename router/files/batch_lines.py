"""A batch input file's lines, each checked on upload as the live request it will become.

Every line is one request (`{"custom_id", "method", "url", "body"}`, OpenAI's format): the method
POST, the URL one of the endpoints a batch may call, the `custom_id` unique in the file, the body
through the same gate as a live request to that endpoint (`router.gate`: decoded, checked, bounded),
and its model one this front door serves and the uploading key may use. A file with any bad line is
refused whole (a 400 naming the first lines at fault and why), so that a batch never starts on a
file that cannot run: what runs later is what was checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from router.admission.auth import Caller
from router.gate.asks import ChatAsk, CompletionAsk, EmbeddingsAsk
from router.gate.body import decoded
from router.gate.gate import Gate
from router.gate.generation import CHAT, COMPLETIONS, RESPONSES
from router.gate.pooling import EMBEDDINGS
from router.openai.errors import InvalidRequestError
from switchboard.config import FrontDoorConfig, ModelKind

# The endpoints a batch's line may call, each with its live requests' gate and the kind of model
# that answers it.
BATCH_ENDPOINTS: dict[str, tuple[Gate[Any, Any], ModelKind]] = {
    "/v1/chat/completions": (CHAT, "generate"),
    "/v1/completions": (COMPLETIONS, "generate"),
    "/v1/responses": (RESPONSES, "generate"),
    "/v1/embeddings": (EMBEDDINGS, "embed"),
}
MAX_CUSTOM_ID_CHARS = 512
# Bad lines named in the refusal (the rest are counted).
LINES_NAMED = 10


class _Line(msgspec.Struct, kw_only=True):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


_line_decoder = msgspec.json.Decoder(_Line)


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    code: str
    message: str


class _BadLine(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class BatchFileCheck:
    """What a batch file's lines need: the key that uploaded it, the models it may name (and their
    kind: None for a name that is served here as nothing), and the bounds of live requests."""

    caller: Caller
    kind_of: Callable[[str], ModelKind | None]
    bounds: FrontDoorConfig
    max_lines: int

    def lines(self, path: Path) -> int:
        """The number of requests in the file at `path`; a 400 if any line is bad (blocking: run it
        in a thread, a file may hold 50,000 requests)."""
        errors: list[LineError] = []
        seen: set[str] = set()
        count = 0
        for number, raw in _numbered_lines(path):
            count += 1
            if count > self.max_lines:
                raise InvalidRequestError(
                    f"A batch file holds at most {self.max_lines:,} requests; this one holds more.",
                    param="file",
                    code="too_many_requests_in_file",
                )
            try:
                self._check(raw, seen)
            except _BadLine as bad:
                errors.append(LineError(number, bad.code, bad.message))
        if errors:
            raise _refusal(errors)
        if count == 0:
            raise InvalidRequestError("The batch file holds no requests.", param="file", code="empty_file")
        return count

    def _check(self, raw: bytes, seen: set[str]) -> None:
        try:
            line = _line_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _BadLine("invalid_json_line", f"not a request line ({exc})") from None
        if not line.custom_id or len(line.custom_id) > MAX_CUSTOM_ID_CHARS:
            raise _BadLine("invalid_custom_id", f"`custom_id` must be 1 to {MAX_CUSTOM_ID_CHARS} characters")
        if line.custom_id in seen:
            raise _BadLine(
                "duplicate_custom_id", f"`custom_id` {line.custom_id!r} is used by an earlier line"
            )
        seen.add(line.custom_id)
        if line.method != "POST":
            raise _BadLine("invalid_method", f"`method` must be POST, not {line.method!r}")
        endpoint = BATCH_ENDPOINTS.get(line.url)
        if endpoint is None:
            raise _BadLine(
                "invalid_url", f"`url` must be one of {', '.join(BATCH_ENDPOINTS)}; got {line.url!r}"
            )
        self._check_body(line, *endpoint)

    def _check_body(self, line: _Line, gate: Gate[Any, Any], kind: ModelKind) -> None:
        try:
            ask = gate.check(decoded(bytes(line.body), gate.decoder), self.bounds)
        except InvalidRequestError as error:
            where = f"`body.{error.param}`: " if error.param else ""
            raise _BadLine(error.code or "invalid_request", where + error.message) from None
        if getattr(ask, "stream", False):
            raise _BadLine(
                "invalid_request", "`body.stream` must be false in a batch: its answers go to a file"
            )
        model = _model_of(ask)
        served_as = self.kind_of(model)
        if served_as is None or not self.caller.may_use(model):
            raise _BadLine(
                "model_not_found", f"the model `{model}` does not exist or this key may not use it"
            )
        if served_as != kind:
            raise _BadLine("invalid_url", f"the model `{model}` does not answer {line.url}")


def _model_of(ask: Any) -> str:
    if isinstance(ask, ChatAsk):
        return ask.chat.model
    if isinstance(ask, CompletionAsk):
        return ask.completion.model
    if isinstance(ask, EmbeddingsAsk):
        return ask.body.model
    raise TypeError(f"no model in {type(ask).__name__}")


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's lines, numbered from 1; blank lines (a last newline, say) are passed over."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            stripped = raw.strip()
            if stripped:
                yield number, stripped


def _refusal(errors: list[LineError]) -> InvalidRequestError:
    named = "; ".join(f"line {error.line}: {error.message}" for error in errors[:LINES_NAMED])
    more = f"; and {len(errors) - LINES_NAMED} more" if len(errors) > LINES_NAMED else ""
    return InvalidRequestError(
        f"The batch file has {len(errors)} invalid line{'s' if len(errors) > 1 else ''}: {named}{more}.",
        param="file",
        code=errors[0].code,
    )
