"""The pooling endpoints against a real Redis, the worker's part played by writing its one last chunk:
the `openai` SDK's embeddings (base64, its default, and floats), classification and rerank over plain
HTTP, a worker's refusal relayed, `/v1/models`, and the keys, limits and deadlines that hold for
every request."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import numpy
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from switchboard import api_keys, gen_ai
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, JobError, SlotStatus
from tests.support.front_door_harness import (
    MODEL,
    advertise,
    next_job,
    serving,
    worker_record,
    write_chunks,
)
from tests.support.metric_samples import counter
from tests.support.pooling_front_door import (
    CLASSIFIER,
    EMBEDDER,
    LABELS,
    RERANKER,
    answer_rows,
    pooling_settings,
    pooling_worker,
    queued_jobs,
)
from tests.support.span_file import read_spans

VECTORS = ([0.5, -0.25, 2.0, 1.0], [-1.5, 0.0, 0.125, 3.0])


def sdk_for(client: httpx.AsyncClient, api_key: str = "unused") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{client.base_url}/v1", api_key=api_key, max_retries=0)


async def test_the_openai_sdk_gets_embeddings_as_base64_and_as_floats(
    redis: aioredis.Redis, redis_server: PrivateRedis, span_file: Path
) -> None:
    before = counter("switchboard:operation_requests", operation="embeddings", model=EMBEDDER, status="200")
    async with (
        serving(pooling_settings(redis_server.url)) as client,
        pooling_worker(redis, EMBEDDER, answer_rows(*VECTORS, prompt_tokens=9)) as jobs,
    ):
        sdk = sdk_for(client)
        # The SDK asks for base64 unless told otherwise, and decodes it.
        decoded = await sdk.embeddings.create(model=EMBEDDER, input=["first", "second"], dimensions=4)
        floats = await sdk.embeddings.create(model=EMBEDDER, input=[[1, 2], [3]], encoding_format="float")
        raw = await client.post(
            "/v1/embeddings", json={"model": EMBEDDER, "input": ["a", "b"], "encoding_format": "base64"}
        )
    for answer in (decoded, floats):
        assert [item.embedding for item in answer.data] == [list(vector) for vector in VECTORS]
        assert [item.index for item in answer.data] == [0, 1]
        assert (answer.model, answer.usage.prompt_tokens, answer.usage.total_tokens) == (EMBEDDER, 9, 9)
    first, second, _ = jobs
    assert first.pooling is not None and first.pooling.task == "embed"
    assert (first.pooling.inputs, first.pooling.dimensions, first.pooling.normalize) == (
        ("first", "second"),
        4,
        True,
    )
    assert second.pooling is not None and second.pooling.inputs == ((1, 2), (3,))
    assert decoded._request_id == first.id
    # base64 is the worker's little-endian float32 row as it came.
    assert raw.headers["x-switchboard-model"] == EMBEDDER
    body = raw.json()
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert base64.b64decode(body["data"][0]["embedding"]) == numpy.asarray(VECTORS[0], dtype="<f4").tobytes()
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    spans = read_spans(span_file)
    job_span = next(s for s in spans if s["name"] == f"embeddings {EMBEDDER}")
    assert job_span["attributes"][gen_ai.OPERATION] == "embeddings"
    assert job_span["attributes"][gen_ai.INPUT_TOKENS] == 9
    after = counter("switchboard:operation_requests", operation="embeddings", model=EMBEDDER, status="200")
    assert after - before == 3


async def test_classify_answers_each_inputs_label_and_probabilities(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    probabilities = ([0.1, 0.2, 0.7], [0.6, 0.3, 0.1])
    answer = answer_rows(*probabilities, prompt_tokens=5, labels=LABELS)
    async with (
        serving(pooling_settings(redis_server.url)) as client,
        pooling_worker(redis, CLASSIFIER, answer) as jobs,
    ):
        response = await client.post("/classify", json={"model": CLASSIFIER, "input": ["good", "bad"]})
        v1 = await client.post("/v1/classify", json={"model": CLASSIFIER, "input": ["good", "bad"]})
    assert response.status_code == 200, response.text
    assert response.headers["x-switchboard-model"] == CLASSIFIER  # as a generation's answer names it
    body = response.json()
    assert body["object"] == "list" and body["model"] == CLASSIFIER
    assert body["id"] == f"classify-{jobs[0].id}" and isinstance(body["created"], int)
    assert [(item["index"], item["label"], item["num_classes"]) for item in body["data"]] == [
        (0, "positive", 3),
        (1, "negative", 3),
    ]
    assert [item["probs"] for item in body["data"]] == [pytest.approx(row) for row in probabilities]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0}
    assert v1.json()["data"] == body["data"]
    assert jobs[0].pooling is not None and jobs[0].pooling.task == "classify"


async def test_rerank_sorts_documents_by_relevance_and_keeps_the_top_n(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    documents = ["about cats", {"text": "about dogs"}, "about birds"]
    answer = answer_rows([0.1], [0.9], [0.5], prompt_tokens=12)
    async with (
        serving(pooling_settings(redis_server.url)) as client,
        pooling_worker(redis, RERANKER, answer) as jobs,
    ):
        whole = await client.post(
            "/rerank", json={"model": RERANKER, "query": "dogs", "documents": documents}
        )
        top = await client.post(
            "/v2/rerank",
            json={
                "model": RERANKER,
                "query": "dogs",
                "documents": documents,
                "top_n": 2,
                "return_documents": False,
            },
        )
    assert whole.status_code == 200, whole.text
    assert whole.headers["x-switchboard-model"] == top.headers["x-switchboard-model"] == RERANKER
    body = whole.json()
    assert [(r["index"], r["document"]["text"]) for r in body["results"]] == [
        (1, "about dogs"),
        (2, "about birds"),
        (0, "about cats"),
    ]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([0.9, 0.5, 0.1])
    assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12}
    assert body["model"] == RERANKER and body["id"] == f"rerank-{jobs[0].id}"
    assert [(r["index"], "document" in r) for r in top.json()["results"]] == [(1, False), (2, False)]
    task = jobs[0].pooling
    assert task is not None and (task.task, task.query, task.inputs) == (
        "score",
        "dogs",
        ("about cats", "about dogs", "about birds"),
    )


async def test_a_workers_refusal_is_a_400_with_its_message_param_and_code(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    message = "This model's maximum context length is 512 tokens, however you requested 600 tokens."
    refusal = JobError(
        code="invalid_request", message=message, param="input", client_code="context_length_exceeded"
    )
    async with (
        serving(pooling_settings(redis_server.url)) as client,
        pooling_worker(redis, EMBEDDER, lambda job: Chunk(error=refusal)),
    ):
        response = await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": "long"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }


async def test_models_lists_every_kind_and_the_sdk_reads_it(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(pooling_settings(redis_server.url)) as client:
        page = await sdk_for(client).models.list()
    kinds = {model.id: (model.model_extra or {}).get("kind") for model in page.data}
    assert {name: kinds[name] for name in (MODEL, EMBEDDER, CLASSIFIER, RERANKER)} == {
        MODEL: "generate",
        EMBEDDER: "embed",
        CLASSIFIER: "classify",
        RERANKER: "score",
    }


async def test_a_keys_models_and_token_limit_hold_and_are_settled_with_the_input_tokens(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    secret = api_keys.new_secret()
    settings = pooling_settings(redis_server.url)
    settings.auth.keys = [ApiKey(name="app", sha256=api_keys.digest(secret), models=[EMBEDDER], tpm=100)]
    headers = {"Authorization": f"Bearer {secret}"}
    # 40 characters: estimated at 10 tokens, settled at the 95 the worker counted.
    text = "x" * 40
    async with (
        serving(settings) as client,
        pooling_worker(redis, EMBEDDER, answer_rows(VECTORS[0], prompt_tokens=95)),
    ):
        forbidden = await client.post("/classify", json={"model": CLASSIFIER, "input": "a"}, headers=headers)
        first = await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": text}, headers=headers)
        second = await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": text}, headers=headers)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "model_not_allowed"
    assert first.status_code == 200, first.text
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "tokens"
    assert "counts about 10" in second.json()["error"]["message"]


async def test_a_keys_parallel_limit_holds_while_its_pooling_job_waits(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    secret = api_keys.new_secret()
    settings = pooling_settings(redis_server.url)
    settings.auth.keys = [ApiKey(name="app", sha256=api_keys.digest(secret), max_parallel=1)]
    headers = {"Authorization": f"Bearer {secret}"}
    body = {"model": RERANKER, "query": "q", "documents": ["a"]}
    async with serving(settings) as client, pooling_worker(redis, RERANKER, None) as jobs:
        waiting = asyncio.create_task(client.post("/rerank", json=body, headers=headers))
        job = await next_job(redis, RERANKER)
        refused = await client.post("/rerank", json=body, headers=headers)
        await write_chunks(redis, job.id, answer_rows([0.5])(job))
        answered = await waiting
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert answered.status_code == 200 and answered.json()["results"][0]["relevance_score"] == 0.5
    assert len(jobs) == 1


async def test_a_pooling_job_past_its_deadline_is_a_504(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1", SlotStatus(model=CLASSIFIER, state="warm")))
    async with (
        serving(pooling_settings(redis_server.url, timeout_s=1.0)) as client,
        pooling_worker(redis, CLASSIFIER, None) as jobs,
    ):
        response = await client.post("/classify", json={"model": CLASSIFIER, "input": "a"})
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "timeout"
    assert len(jobs) == 1 and await queued_jobs(redis) == 1
