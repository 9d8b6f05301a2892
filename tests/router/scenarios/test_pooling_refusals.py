"""Bad pooling requests get OpenAI's error shape and a 400 before anything is queued: malformed
inputs, parameters the model cannot honour, a model of another kind than the endpoint's (both
ways: an embeddings request to a generator, a chat request to an embedder), routes and pipelines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import PipelineConfig, RouteConfig
from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.kept_text import CUT_SLACK_CHARS, FRONT_DOOR_CHARS_PER_TOKEN
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import ModelLimits, encode
from tests.support.front_door_harness import MODEL, serving
from tests.support.pooling_front_door import (
    ANY_SIZE_EMBEDDER,
    CLASSIFIER,
    EMBEDDER,
    RERANKER,
    WHOLE_EMBEDDER,
    answer_rows,
    pooling_settings,
    pooling_worker,
    queued_jobs,
)

CONTEXT = CONTEXT_LENGTH_EXCEEDED
ROUTE = "chat"
PIPELINE = "resilient"


def embed(**fields: Any) -> dict[str, Any]:
    return {"model": EMBEDDER, "input": "Hi", **fields}


def rerank(**fields: Any) -> dict[str, Any]:
    return {"model": RERANKER, "query": "q", "documents": ["a"], **fields}


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    # Short: on code that queued one of these requests, the test fails at its deadline, not later.
    settings = pooling_settings(redis_server.url, timeout_s=2.0)
    settings.routes = {ROUTE: RouteConfig(targets={MODEL: 100})}
    settings.pipelines = {PIPELINE: PipelineConfig(fallbacks=[MODEL])}
    async with serving(settings) as client:
        yield client


REFUSALS: list[tuple[str, str, dict[str, Any], str | None, str]] = [
    # (path, body, param, words of the message)
    ("empty string", "/v1/embeddings", embed(input=""), "input", "empty string"),
    ("empty list", "/v1/embeddings", embed(input=[]), "input", "empty list"),
    ("empty string in a list", "/v1/embeddings", embed(input=["a", ""]), "input[1]", "empty string"),
    ("empty token list", "/v1/embeddings", embed(input=[[1], []]), "input[1]", "list of token ids"),
    ("a float among token ids", "/v1/embeddings", embed(input=[[1, 2.5]]), "input[0]", "token ids"),
    ("a negative token id", "/v1/embeddings", embed(input=[3, -1]), "input[1]", "Token ids"),
    ("2049 inputs", "/v1/embeddings", embed(input=["a"] * 2049), "input", "At most 2048"),
    ("no input", "/v1/embeddings", {"model": EMBEDDER}, "input", "Missing required parameter"),
    (
        "encoding_format",
        "/v1/embeddings",
        embed(encoding_format="hex"),
        "encoding_format",
        "`float` or `base64`",
    ),
    ("dimensions 0", "/v1/embeddings", embed(dimensions=0), "dimensions", ">= 1"),
    (
        "dimensions of a whole-vector model",
        "/v1/embeddings",
        embed(model=WHOLE_EMBEDDER, dimensions=4),
        "dimensions",
        "This model does not support specifying dimensions",
    ),
    ("dimensions not trained for", "/v1/embeddings", embed(dimensions=5), "dimensions", "4, 8"),
    (
        "truncate_prompt_tokens -2",
        "/v1/embeddings",
        embed(truncate_prompt_tokens=-2),
        "truncate_prompt_tokens",
        ">= -1",
    ),
    (
        "truncate_prompt_tokens 0",
        "/v1/embeddings",
        embed(truncate_prompt_tokens=0),
        "truncate_prompt_tokens",
        "at least 1",
    ),
    (
        "embeddings of a generator",
        "/v1/embeddings",
        embed(model=MODEL),
        "model",
        f"The model `{MODEL}` does not support the embeddings API: it is a text generation model, "
        "served at /v1/chat/completions, /v1/completions and /v1/responses.",
    ),
    (
        "embeddings of a classifier",
        "/v1/embeddings",
        embed(model=CLASSIFIER),
        "model",
        "does not support the embeddings API: it is a classification model, served at /classify",
    ),
    (
        "classification by an embedder",
        "/classify",
        {"model": EMBEDDER, "input": "Hi"},
        "model",
        "does not support the classification API: it is an embedding model, served at /v1/embeddings",
    ),
    (
        "rerank by a classifier",
        "/v1/rerank",
        rerank(model=CLASSIFIER),
        "model",
        "does not support the rerank API: it is a classification model",
    ),
    (
        "classification by a reranker",
        "/v1/classify",
        {"model": RERANKER, "input": ["a"]},
        "model",
        "it is a reranking (cross-encoder) model, served at /rerank",
    ),
    ("classification of nothing", "/classify", {"model": CLASSIFIER, "input": []}, "input", "empty list"),
    ("rerank of no documents", "/rerank", rerank(documents=[]), "documents", "empty list"),
    (
        "rerank of an empty document",
        "/v2/rerank",
        rerank(documents=["a", ""]),
        "documents[1]",
        "empty string",
    ),
    (
        "rerank of a document without text",
        "/rerank",
        rerank(documents=[{"title": "a"}]),
        "documents[0]",
        "`text`",
    ),
    ("rerank of an empty query", "/rerank", rerank(query=""), "query", "`query` is empty"),
    (
        "raw logits of a classifier",
        "/classify",
        {"model": CLASSIFIER, "input": "a", "use_activation": False},
        "use_activation",
        "not raw logits",
    ),
    ("raw logits of a reranker", "/rerank", rerank(use_activation=False), "use_activation", "not raw logits"),
    ("rerank top_n -1", "/rerank", rerank(top_n=-1), "top_n", ">= 0"),
    (
        "chat with an embedder",
        "/v1/chat/completions",
        {"model": EMBEDDER, "messages": [{"role": "user", "content": "Hi"}]},
        "model",
        f"The model `{EMBEDDER}` does not support the chat completions API: it is an embedding model, "
        "served at /v1/embeddings.",
    ),
    (
        "completion with a reranker",
        "/v1/completions",
        {"model": RERANKER, "prompt": "Hi"},
        "model",
        "does not support the completions API: it is a reranking (cross-encoder) model",
    ),
    (
        "embeddings of a route",
        "/v1/embeddings",
        embed(model=ROUTE),
        "model",
        "serve chat and completions only",
    ),
    ("rerank by a pipeline", "/rerank", rerank(model=PIPELINE), "model", "serve chat and completions only"),
]


@pytest.mark.parametrize(
    ("path", "body", "param", "words"), [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS]
)
async def test_a_bad_pooling_request_is_a_400_and_queues_nothing(
    front_door: httpx.AsyncClient,
    redis: aioredis.Redis,
    path: str,
    body: dict[str, Any],
    param: str,
    words: str,
) -> None:
    response = await front_door.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    assert await queued_jobs(redis) == 0


LIMITS = ModelLimits(max_model_len=16, vocab_size=100, max_token_chars=4, embedding_size=8)


@pytest.mark.parametrize(
    ("path", "body", "param", "code", "words"),
    [
        (
            "/v1/embeddings",
            embed(input=["short", "x" * 65]),
            "input",
            CONTEXT,
            "maximum context length is 16",
        ),
        ("/v1/embeddings", embed(input=[list(range(17))]), "input", CONTEXT, "takes 17 tokens"),
        ("/rerank", rerank(query="q" * 40, documents=["d" * 30]), "documents", CONTEXT, "70 characters"),
        ("/classify", {"model": CLASSIFIER, "input": [5, 100]}, "input", "invalid_value", "vocabulary"),
        # Any size up to the model's is allowed (`matryoshka_dimensions = []`), so only the worker's
        # published size says 16 is too many.
        (
            "/v1/embeddings",
            embed(model=ANY_SIZE_EMBEDDER, dimensions=16),
            "dimensions",
            "invalid_value",
            "8 dim",
        ),
    ],
    ids=["text", "token ids", "query and document", "vocabulary", "dimensions above the size"],
)
async def test_an_input_past_the_models_published_limits_is_a_400(
    front_door: httpx.AsyncClient,
    redis: aioredis.Redis,
    path: str,
    body: dict[str, Any],
    param: str,
    code: str,
    words: str,
) -> None:
    for name in (EMBEDDER, ANY_SIZE_EMBEDDER, CLASSIFIER, RERANKER):
        await redis.set(keys.model_limits(name), encode(LIMITS))
    response = await front_door.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert words in error["message"]
    assert await queued_jobs(redis) == 0


async def test_an_input_past_the_context_is_queued_when_truncation_is_asked_for(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    await redis.set(keys.model_limits(EMBEDDER), encode(LIMITS))
    body = embed(input="x" * 65, truncate_prompt_tokens=-1)
    async with pooling_worker(redis, EMBEDDER, answer_rows([1.0])) as jobs:
        response = await front_door.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    assert jobs[0].pooling is not None and jobs[0].pooling.truncate_prompt_tokens == -1


# Bounds of one pooling request (router settings), at their defaults.
QUERY_CHARS = 256 * 1024
OUTPUT_VALUES = 2048 * 4096


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/rerank", rerank(query="q" * (QUERY_CHARS + 1)), "query", "at most 262,144"),
        (
            "/v1/rerank",
            rerank(query="q " * (QUERY_CHARS // 2 + 1), truncate_prompt_tokens=8),
            "query",
            "Shorten it",
        ),
        (
            "/v1/embeddings",
            embed(model=ANY_SIZE_EMBEDDER, input=["a"] * 2048, dimensions=OUTPUT_VALUES // 2048 + 1),
            "dimensions",
            "one answer holds at most 8,388,608",
        ),
    ],
    ids=["rerank query", "rerank query with truncation", "embeddings values"],
)
async def test_a_pooling_request_past_a_bound_is_a_400_and_queues_nothing(
    front_door: httpx.AsyncClient,
    redis: aioredis.Redis,
    path: str,
    body: dict[str, Any],
    param: str,
    words: str,
) -> None:
    response = await front_door.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, "invalid_value")
    assert words in error["message"]
    assert await queued_jobs(redis) == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", embed(truncate_prompt_tokens=17), "truncate_prompt_tokens"),
        (
            "/classify",
            {"model": CLASSIFIER, "input": "a", "truncate_prompt_tokens": 17},
            "truncate_prompt_tokens",
        ),
        ("/rerank", rerank(truncate_prompt_tokens=17), "truncate_prompt_tokens"),
    ],
    ids=["embeddings", "classify", "rerank"],
)
async def test_keeping_more_tokens_than_the_models_context_is_a_400(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, path: str, body: dict[str, Any], param: str
) -> None:
    for name in (EMBEDDER, CLASSIFIER, RERANKER):
        await redis.set(keys.model_limits(name), encode(LIMITS))
    response = await front_door.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert "maximum context length (16 tokens); it is 17" in error["message"]
    assert await queued_jobs(redis) == 0


@pytest.mark.parametrize(
    ("path", "model", "body"),
    [
        ("/v1/embeddings", EMBEDDER, embed(input=["head " * 20_000 + "tail"], truncate_prompt_tokens=8)),
        (
            "/classify",
            CLASSIFIER,
            {"model": CLASSIFIER, "input": "head " * 20_000 + "tail", "truncate_prompt_tokens": 8},
        ),
        (
            "/rerank",
            RERANKER,
            rerank(
                query="head " * 20_000 + "tail",
                documents=["head " * 20_000 + "tail"],
                truncate_prompt_tokens=8,
            ),
        ),
    ],
    ids=["embeddings", "classify", "rerank"],
)
async def test_a_text_that_keeps_its_last_tokens_is_queued_cut_to_what_they_can_span(
    front_door: httpx.AsyncClient, redis: aioredis.Redis, path: str, model: str, body: dict[str, Any]
) -> None:
    """100 KB texts keeping 8 tokens travel as at most 8 tokens' worth of characters (64 each, and
    a little before them, to cut where a word begins); a rerank still answers its documents whole."""
    async with pooling_worker(redis, model, answer_rows([0.5], labels=("a",))) as jobs:
        response = await front_door.post(path, json=body)
    assert response.status_code == 200, response.text
    task = jobs[0].pooling
    assert task is not None
    texts = [*task.inputs, *([task.query] if task.query is not None else [])]
    assert all(isinstance(text, str) and text.endswith("head tail") for text in texts)
    assert all(len(text) <= 8 * FRONT_DOOR_CHARS_PER_TOKEN + CUT_SLACK_CHARS for text in texts)
    if path == "/rerank":
        assert response.json()["results"][0]["document"]["text"] == body["documents"][0]


async def test_an_answer_past_the_output_bound_at_the_models_own_size_is_refused(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Without `dimensions`, the answer's size is the inputs times the vector size the model's
    workers published (8 here): past `max_pooling_output_values` it is a 400 naming `input`."""
    settings = pooling_settings(redis_server.url, timeout_s=2.0)
    settings.router.max_pooling_output_values = 8 * 100
    await redis.set(keys.model_limits(EMBEDDER), encode(LIMITS))
    async with serving(settings) as client:
        response = await client.post("/v1/embeddings", json=embed(input=["x"] * 101))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "input" and "808 values" in error["message"], error
        assert await queued_jobs(redis) == 0
        async with pooling_worker(redis, EMBEDDER, answer_rows(*[[1.0] * 8] * 100)):
            within = await client.post("/v1/embeddings", json=embed(input=["x"] * 100))
        assert within.status_code == 200, within.text
