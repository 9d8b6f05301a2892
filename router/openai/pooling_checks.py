"""Checks of the pooling endpoints' requests that no field's type can express: the inputs' shapes,
the model's kind against the endpoint, `dimensions` against what the model was trained for, and the
bounds on one request (`router.*` settings): a rerank query's length, and the values an answer holds.

Each failure is a 400 naming the parameter at fault, raised before anything is queued. A text longer
than its kept tokens can span is cut where its job is built (`switchboard.kept_text`), not refused.
"""

from __future__ import annotations

from typing import Any

from router.openai.checks import invalid, unsupported
from router.openai.classify import ClassificationRequest
from router.openai.common import INT32_MAX
from router.openai.embeddings import EmbeddingRequest
from router.openai.errors import InvalidRequestError
from router.openai.rerank import RerankRequest
from switchboard.config import FrontDoorConfig, ModelConfig, ModelKind
from switchboard.wire import ModelLimits, Prompt

# OpenAI's bound on the inputs of one embeddings request; the same holds for the other endpoints.
MAX_INPUTS = 2048
# OpenAI's own words for an input it cannot take; what follows them says which and why.
_OPENAI_INVALID_INPUT = "'$.input' is invalid."

# What each kind of model is called, and the endpoints that serve it.
_KIND_NAMES: dict[ModelKind, str] = {
    "generate": "a text generation model",
    "embed": "an embedding model",
    "classify": "a classification model",
    "score": "a reranking (cross-encoder) model",
}
KIND_ENDPOINTS: dict[ModelKind, str] = {
    "generate": "/v1/chat/completions, /v1/completions and /v1/responses",
    "embed": "/v1/embeddings",
    "classify": "/classify",
    "score": "/rerank",
}


def check_embedding_request(body: EmbeddingRequest, bounds: FrontDoorConfig) -> tuple[Prompt, ...]:
    """Every check of an embeddings request that needs no model; its inputs, as they will be sent."""
    inputs = pooling_inputs(body.input)
    check_encoding_format(body.encoding_format)
    check_truncation(body.truncate_prompt_tokens)
    if body.dimensions is not None:
        _check_output_values(len(inputs), body.dimensions, "dimensions", bounds)
    return inputs


def check_classification_request(body: ClassificationRequest, bounds: FrontDoorConfig) -> tuple[Prompt, ...]:
    """Every check of a classification request that needs no model; its inputs, as they will be sent."""
    inputs = pooling_inputs(body.input)
    check_truncation(body.truncate_prompt_tokens)
    check_activation(body.use_activation)
    return inputs


def check_rerank_request(body: RerankRequest, bounds: FrontDoorConfig) -> tuple[str, ...]:
    """Every check of a rerank request that needs no model; its documents' texts, as they will be sent."""
    check_query(body.query)
    check_query_length(body.query, bounds)
    documents = rerank_documents(body.documents)
    check_truncation(body.truncate_prompt_tokens)
    check_activation(body.use_activation)
    return documents


def check_model_kind(model: ModelConfig, wanted: ModelKind, api: str) -> None:
    """A 400 unless `model` is of the kind the endpoint (`api`, as in "the embeddings API") serves."""
    if model.kind == wanted:
        return
    raise InvalidRequestError(
        f"The model `{model.name}` does not support the {api} API: it is {_KIND_NAMES[model.kind]}, "
        f"served at {KIND_ENDPOINTS[model.kind]}.",
        param="model",
        code="unsupported_model",
    )


def not_a_model(name: str, api: str) -> InvalidRequestError:
    """The 400 for a pooling request naming a route or a pipeline, which serve text generation only."""
    return InvalidRequestError(
        f"`{name}` is a route or a pipeline, which serve chat and completions only; the {api} API "
        "takes the name of a configured model.",
        param="model",
        code="unsupported_model",
    )


def pooling_inputs(value: str | list[Any], param: str = "input") -> tuple[Prompt, ...]:
    """The inputs of an embeddings or classification request in OpenAI's four shapes: a string, a
    list of strings, a list of token ids, or a list of non-empty lists of token ids."""
    if isinstance(value, str):
        return (_text(value, param),)
    if not value:
        raise invalid(param, f"{_OPENAI_INVALID_INPUT} `{param}` is an empty list; give at least one input.")
    if all(_is_int(item) for item in value):
        return (_token_ids(value, param),)
    _check_count(value, param)
    inputs: list[Prompt] = []
    for position, item in enumerate(value):
        at = f"{param}[{position}]"
        if isinstance(item, str):
            inputs.append(_text(item, at))
        elif isinstance(item, list) and item and all(_is_int(token) for token in item):
            inputs.append(_token_ids(item, at))
        else:
            raise invalid(
                at,
                f"{_OPENAI_INVALID_INPUT} `{param}` must be a string, a list of strings, a list of token "
                "ids (non-negative integers) or a list of non-empty lists of token ids.",
            )
    return tuple(inputs)


def rerank_documents(documents: str | list[Any]) -> tuple[str, ...]:
    """The documents of a rerank request: strings, or objects with `text` (Jina's and Cohere's form)."""
    if isinstance(documents, str):
        return (_text(documents, "documents"),)
    if not documents:
        raise invalid("documents", "`documents` is an empty list; give at least one document.")
    _check_count(documents, "documents")
    texts = []
    for position, document in enumerate(documents):
        at = f"documents[{position}]"
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise invalid(at, f"`{at}` must be a string, or an object whose `text` is a string.")
        texts.append(_text(text, at))
    return tuple(texts)


def check_query(query: str) -> None:
    """A 400 for an empty rerank query."""
    if not query:
        raise invalid("query", "`query` is empty; give at least one character.")


def check_query_length(query: str, bounds: FrontDoorConfig) -> None:
    """A 400 for a rerank query longer than `router.max_rerank_query_chars`, truncated or not."""
    if len(query) > bounds.max_rerank_query_chars:
        raise invalid(
            "query",
            f"`query` is {len(query):,} characters long; at most {bounds.max_rerank_query_chars:,} are "
            "taken. Shorten it: it is read beside every document.",
        )


def check_encoding_format(encoding_format: str) -> None:
    """A 400 for an `encoding_format` other than OpenAI's two."""
    if encoding_format not in ("float", "base64"):
        raise invalid(
            "encoding_format",
            f"`encoding_format` must be `float` or `base64` (little-endian float32, base64-encoded); "
            f"got {encoding_format!r}.",
        )


def check_activation(use_activation: bool | None) -> None:
    """A 400 for vLLM's `use_activation: false` on a classifier or reranker: the workers answer
    probabilities and scores, never raw logits."""
    if use_activation is False:
        raise unsupported(
            "use_activation", "classifiers answer probabilities and rerankers scores, not raw logits"
        )


def check_truncation(truncate_prompt_tokens: int | None) -> None:
    """A 400 for `truncate_prompt_tokens: 0`, which would leave nothing of any input."""
    if truncate_prompt_tokens == 0:
        raise invalid(
            "truncate_prompt_tokens",
            "`truncate_prompt_tokens` must be at least 1 (the tokens kept of each input), or -1 for as "
            "many as the model takes.",
        )


def check_dimensions(model: ModelConfig, dimensions: int | None) -> None:
    """A 400 for `dimensions` that the model was not trained to be cut to (`matryoshka_dimensions`)."""
    if dimensions is None:
        return
    sizes = model.matryoshka_dimensions
    if sizes is None:
        raise InvalidRequestError(
            f"This model does not support specifying dimensions: `{model.name}` returns its vectors "
            "whole. Leave `dimensions` out.",
            param="dimensions",
            code="unsupported_parameter",
        )
    if sizes and dimensions not in sizes:
        raise invalid(
            "dimensions",
            f"The model `{model.name}` can return vectors of {', '.join(map(str, sorted(sizes)))} "
            f"dimensions; `dimensions` is {dimensions}.",
        )


def check_pooling_output(
    model: ModelConfig,
    inputs: int,
    dimensions: int | None,
    bounds: FrontDoorConfig,
    limits: ModelLimits | None,
) -> None:
    """A 400 for an embeddings answer of more values than `router.max_pooling_output_values`: `inputs`
    vectors of `dimensions`, or of the model's own size where its workers published it (`limits`;
    unknown until the model was first loaded). Called once the model is known; a reranker answers
    one value per input, and a classifier's labels are not known here."""
    if model.kind != "embed":
        return
    if dimensions is not None:
        _check_output_values(inputs, dimensions, "dimensions", bounds)
    elif limits is not None and limits.embedding_size is not None:
        _check_output_values(inputs, limits.embedding_size, "input", bounds)


def _check_output_values(inputs: int, dimensions: int, param: str, bounds: FrontDoorConfig) -> None:
    values = inputs * dimensions
    if values <= bounds.max_pooling_output_values:
        return
    fewer = "fewer dimensions or fewer inputs" if param == "dimensions" else "fewer inputs"
    raise invalid(
        param,
        f"{inputs:,} embeddings of {dimensions:,} dimensions are {values:,} values; one answer holds at "
        f"most {bounds.max_pooling_output_values:,}. Ask for {fewer}, over several requests.",
    )


def _text(text: str, param: str) -> str:
    if not text:
        raise invalid(
            param, f"{_OPENAI_INVALID_INPUT} `{param}` is an empty string; give at least one character."
        )
    return text


def _token_ids(ids: list[Any], param: str) -> tuple[int, ...]:
    for position, token in enumerate(ids):
        if not 0 <= token <= INT32_MAX:
            raise invalid(
                f"{param}[{position}]",
                f"Token ids are integers from 0 to {INT32_MAX}; `{param}[{position}]` is {token}.",
            )
    return tuple(ids)


def _check_count(items: list[Any], param: str) -> None:
    if len(items) > MAX_INPUTS:
        raise invalid(param, f"At most {MAX_INPUTS} inputs per request; `{param}` holds {len(items)}.")


def _is_int(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)
