"""What TensorRT-LLM refuses of a request itself, said as the client's error (a 400), and what stays the
engine's: its argument checks as a request is made and submitted, a guide its grammar backend cannot
compile before any output, a prompt longer than one step where chunked prefill is off, and images
(which this engine does not take yet)."""

from __future__ import annotations

from typing import Any

from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from workers.engines.base import EngineRequest, InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt
from workers.engines.refusals import client_error
from workers.engines.trtllm.io import GUIDED_DECODING_ERROR


def submit_refusal(exc: BaseException) -> InvalidEngineRequest | None:
    """The client's error that `exc`, raised while a request is made or submitted, stands for; None
    for an engine failure.

    TensorRT-LLM checks a request's own arguments as its SamplingParams is made (`_validate`: one
    guide, best_of at least n, no several greedy choices) and as `LLM.generate_async` takes it
    (`_check_arguments`: the prompt within max_num_tokens, n within max_batch_size, ...), and raises
    ValueError for each. Anything else there (a RuntimeError: "LLM is shutting down") is the engine's.
    """
    return client_error(exc) if isinstance(exc, ValueError) else None


def stream_refusal(
    exc: BaseException, *, before_output: bool, request_error: type[BaseException]
) -> InvalidEngineRequest | None:
    """The client's error that `exc`, raised by a request's stream, stands for; None for an engine failure.

    A request's stream raises TensorRT-LLM's `RequestError` with whatever message its executor ended
    the request with: a guide the grammar backend cannot compile (an invalid regex or grammar), before
    any output, is the client's; the rest (a failed step, a token the grammar refuses mid-way, a dead
    executor) is the engine's.
    """
    if not before_output or not isinstance(exc, request_error):
        return None
    reason = str(exc.args[0]) if exc.args else ""
    return client_error(exc) if reason.startswith(GUIDED_DECODING_ERROR) else None


def check_one_step_holds(llm: Any, prompt: BuiltPrompt, prompt_param: str) -> None:
    """Refuse a prompt longer than one step's tokens where the model runs without chunked prefill.

    TensorRT-LLM (1.2, PyTorch backend) refuses it as it is submitted (`BaseLLM._check_arguments`)
    with a RequestError, which is also what its executor's failures raise: said here, it is the
    client's, with OpenAI's code.
    """
    args = getattr(llm, "args", None)
    limit = getattr(args, "max_num_tokens", None)
    if getattr(args, "enable_chunked_prefill", True) or not limit or len(prompt.token_ids) <= limit:
        return
    raise InvalidEngineRequest(
        f"This model takes prompts of at most {limit} tokens (its max_num_tokens, without chunked "
        f"prefill); this one has {len(prompt.token_ids)}.",
        param=prompt_param,
        code=CONTEXT_LENGTH_EXCEEDED,
    )


def check_no_images(model: str, request: EngineRequest) -> None:
    """Refuse a request with images: this engine's multimodal path is not written yet, so a model on
    it takes text only, whatever its files say."""
    if request.images or any(isinstance(part, int) for m in request.messages or () for part in m.parts):
        raise InvalidEngineRequest(
            f"The model `{model}` takes no images here: images are not supported on the TensorRT-LLM "
            "engine yet; send text only.",
            param="messages",
            code="model_takes_no_images",
        )
