"""An engine's refusal of a request, quoted to the client in words fit for the client.

Every engine (vLLM, TensorRT-LLM) says why it refused a request in its own words, which may quote
the request at length (a regex, a grammar) and name files of the machine (its native library's
sources, a model's files). `client_error` keeps the reason and drops the rest; which exceptions are
refusals at all is each engine's business (`vllm.io.refusal_of`, `trtllm.io.refusal_of`).
"""

from __future__ import annotations

import re

from workers.engines.base import InvalidEngineRequest

__all__ = ["MAX_REASON_CHARS", "client_error"]

# The place in its own sources that a native library (xgrammar) puts before its messages:
# `[17:46:50] /project/cpp/regex_converter.cc:83: `. It says nothing to a client.
_NATIVE_SOURCE = re.compile(r"\[\d{2}:\d{2}:\d{2}\] \S+:\d+: ")
# A file's path in a Python library's message (`/usr/lib/.../tokenizer.json`): the machine's business.
_FILE_PATH = re.compile(r"(?<![\w:/])/(?:[\w.-]+/)+[\w.-]+")
# A refusal quotes the engine's reason, which may quote the request (a regex, a grammar) at length.
MAX_REASON_CHARS = 500


def client_error(cause: BaseException) -> InvalidEngineRequest:
    """The client's error for the engine's refusal `cause`, in words fit for the client."""
    # The first argument only: vLLM's VLLMValidationError's text adds the refused value, which may
    # be long.
    reason = str(cause.args[0]) if cause.args else str(cause)
    reason = _FILE_PATH.sub("<path>", _NATIVE_SOURCE.sub("", reason)).strip()
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + "..."
    # vLLM names the parameter at fault where it can, with OpenAI's names (`max_tokens`, `logprobs`).
    param = getattr(cause, "parameter", None)
    return InvalidEngineRequest(
        f"The model's engine refused the request: {reason}",
        param=param if isinstance(param, str) else None,
        code="invalid_value",
    )
