"""Embedders, classifiers and rerankers through every real part, with the clients people use.

One stack for the module, as `switchboard up` starts it: Redis, one worker and the front door, with
the tiny demo embedder, classifier and cross-encoder reranker (random-weight BERTs, built here, no
download) preloaded, a second embedder on the same folder whose vectors are whole only, and the demo
LLM (never loaded: the requests that name it are refused before anything is queued). The clients are
the official `openai` SDK (floats and base64), langchain-openai's `OpenAIEmbeddings`, plain HTTP for
`/classify` and `/v1/rerank`, and `switchboard models`.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import redis
from openai import AsyncOpenAI, OpenAI

from switchboard import keys
from switchboard.cli.models import show_models
from switchboard.local.demo_model import config_entry
from switchboard.local.demo_pooling_models import (
    CLASSIFIER_LABELS,
    DEMO_CLASSIFIER_NAME,
    DEMO_EMBEDDER_NAME,
    DEMO_RERANKER_NAME,
    HIDDEN_SIZE,
    build_demo_classifier,
    build_demo_embedder,
    build_demo_reranker,
    pooling_config_entry,
)
from tests.support.pooling_requests import BAD_REQUESTS, TOO_LONG, WHOLE_EMBEDDER
from tests.support.stack import MODEL, Stack, running_stack

pytestmark = pytest.mark.e2e

EMBEDDER, CLASSIFIER, RERANKER = DEMO_EMBEDDER_NAME, DEMO_CLASSIFIER_NAME, DEMO_RERANKER_NAME
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A queue holds the requests while the workers are busy.",
    "What is the capital of France?",
    "Keep your answers short, honest and kind.",
    "The river flows through the valley toward the distant ocean.",
    "Numbers like 1, 2, 3 and 42",
    "Hello!",
    "Send the result back to the user when the work is done.",
]
SAME_VECTOR_COSINE = 0.999


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def pooling_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three demo pooling models, built once for the module."""
    root = tmp_path_factory.mktemp("pooling-models")
    return {
        "embed": build_demo_embedder(root / "embedder"),
        "classify": build_demo_classifier(root / "classifier"),
        "score": build_demo_reranker(root / "reranker"),
    }


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    demo_model_dir: Path,
    pooling_dirs: dict[str, Path],
) -> Iterator[Stack]:
    """Redis, one worker with the three pooling models loaded and answering, and the front door."""
    config = {
        "models": [
            *(pooling_config_entry(path, kind, preload=True) for kind, path in pooling_dirs.items()),
            pooling_config_entry(
                pooling_dirs["embed"], "embed", name=WHOLE_EMBEDDER, matryoshka_dimensions=None
            ),
            config_entry(demo_model_dir),
        ]
    }
    with running_stack(config, root=tmp_path_factory.mktemp("pooling"), session=request.session) as stack:
        for model in (EMBEDDER, CLASSIFIER, RERANKER):
            stack.wait_serving(model)  # its kind's smallest request: an embedding, a classification, a rerank
        yield stack


@pytest.fixture
def client(stack: Stack) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def alone(stack: Stack) -> dict[str, list[float]]:
    """Each of TEXTS embedded in a request of its own, one after another."""
    vectors = {}
    for text in TEXTS:
        reply = httpx.post(
            f"{stack.base_url}/v1/embeddings", json={"model": EMBEDDER, "input": text}, timeout=60
        )
        vectors[text] = reply.json()["data"][0]["embedding"]
    return vectors


# --- the openai SDK --------------------------------------------------------------------------------


def test_the_sdk_gets_unit_vectors_alike_as_base64_and_as_floats(
    client: OpenAI, alone: dict[str, list[float]]
) -> None:
    # The SDK asks for base64 unless told otherwise, and decodes it into floats itself.
    default = client.embeddings.create(model=EMBEDDER, input=TEXTS[0], user="someone")
    floats = client.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float")
    for reply in (default, floats):
        (item,) = reply.data
        assert item.index == 0 and len(item.embedding) == HIDDEN_SIZE
        assert np.linalg.norm(item.embedding) == pytest.approx(1.0, abs=1e-4)
        assert reply.usage.prompt_tokens > 2 and reply.model == EMBEDDER
        assert cosine(item.embedding, alone[TEXTS[0]]) >= SAME_VECTOR_COSINE
    raw = client.embeddings.with_raw_response.create(model=EMBEDDER, input=TEXTS[0], encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    np.testing.assert_allclose(decoded, floats.data[0].embedding, rtol=1e-6, atol=1e-7)


async def test_each_of_64_concurrent_requests_gets_its_own_texts_vector(
    stack: Stack, alone: dict[str, list[float]]
) -> None:
    texts = [TEXTS[i % len(TEXTS)] for i in range(64)]
    async with AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as sdk:
        replies = await asyncio.gather(*(sdk.embeddings.create(model=EMBEDDER, input=text) for text in texts))
    for text, reply in zip(texts, replies, strict=True):
        vector = reply.data[0].embedding
        assert cosine(vector, alone[text]) >= SAME_VECTOR_COSINE
        # The demo embedder tells these texts apart: a row of another text would show.
        others = [cosine(vector, alone[other]) for other in TEXTS if other != text]
        assert max(others) < SAME_VECTOR_COSINE


def test_a_list_is_one_job_with_a_vector_per_input_in_order(
    client: OpenAI, stack: Stack, alone: dict[str, list[float]]
) -> None:
    jobs = redis.Redis.from_url(stack.redis_url)
    added_before = jobs.xinfo_stream(keys.job_stream(EMBEDDER))["entries-added"]
    reply = client.embeddings.create(model=EMBEDDER, input=TEXTS)
    assert jobs.xinfo_stream(keys.job_stream(EMBEDDER))["entries-added"] == added_before + 1
    assert [item.index for item in reply.data] == list(range(len(TEXTS)))
    for text, item in zip(TEXTS, reply.data, strict=True):
        assert cosine(item.embedding, alone[text]) >= SAME_VECTOR_COSINE
    single = client.embeddings.create(model=EMBEDDER, input=TEXTS[0])
    assert reply.usage.prompt_tokens > single.usage.prompt_tokens


def test_token_ids_as_the_tokenizer_gives_them_embed_like_the_text(
    client: OpenAI, pooling_dirs: dict[str, Path], alone: dict[str, list[float]]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pooling_dirs["embed"])
    ids = [tokenizer(text)["input_ids"] for text in TEXTS[:2]]
    one = client.embeddings.create(model=EMBEDDER, input=ids[0])
    two = client.embeddings.create(model=EMBEDDER, input=ids)
    assert one.usage.prompt_tokens == len(ids[0])
    assert cosine(one.data[0].embedding, alone[TEXTS[0]]) >= SAME_VECTOR_COSINE
    for text, item in zip(TEXTS[:2], two.data, strict=True):
        assert cosine(item.embedding, alone[text]) >= SAME_VECTOR_COSINE


def test_dimensions_cut_the_vector_and_scale_it_to_unit_length(
    client: OpenAI, alone: dict[str, list[float]]
) -> None:
    reply = client.embeddings.create(model=EMBEDDER, input=TEXTS[0], dimensions=32)
    vector = reply.data[0].embedding
    assert len(vector) == 32
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
    assert cosine(vector, alone[TEXTS[0]][:32]) >= SAME_VECTOR_COSINE


def test_too_long_an_input_is_cut_when_the_caller_asks(client: OpenAI) -> None:
    long_text = " ".join(["the quick brown fox"] * 200)  # well past the model's 512 positions
    kept = client.embeddings.create(
        model=EMBEDDER, input=long_text, extra_body={"truncate_prompt_tokens": 16}
    )
    assert len(kept.data[0].embedding) == HIDDEN_SIZE
    assert kept.usage.prompt_tokens == 16
    most = client.embeddings.create(
        model=EMBEDDER, input=long_text, extra_body={"truncate_prompt_tokens": -1}
    )
    assert most.usage.prompt_tokens == 512


# --- langchain-openai ------------------------------------------------------------------------------


def test_langchain_embeds_documents_and_queries(stack: Stack, alone: dict[str, list[float]]) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=EMBEDDER,
        base_url=f"{stack.base_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embeddings.embed_documents(TEXTS[:3])
    assert len(documents) == 3
    for text, vector in zip(TEXTS, documents, strict=False):
        assert cosine(vector, alone[text]) >= SAME_VECTOR_COSINE
    assert cosine(embeddings.embed_query(TEXTS[1]), alone[TEXTS[1]]) >= SAME_VECTOR_COSINE


def test_langchain_with_its_defaults_gets_a_clear_400_for_ids_past_the_vocabulary(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With its defaults it sends tiktoken's token ids (cl100k_base, read from the copy litellm ships,
    # so that nothing is downloaded): ids far past the demo vocabulary of 400.
    from langchain_openai import OpenAIEmbeddings

    # Found without importing litellm, whose import fetches its cost map from the network.
    litellm = importlib.util.find_spec("litellm")
    assert litellm is not None and litellm.origin is not None
    tiktoken_files = Path(litellm.origin).parent / "litellm_core_utils" / "tokenizers"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_files))
    embeddings = OpenAIEmbeddings(
        model=EMBEDDER,
        base_url=f"{stack.base_url}/v1",
        api_key="unused",
        max_retries=0,  # type: ignore[arg-type]
    )
    # The demo embedder's vocabulary is 400 tokens: tiktoken's ids are past it, a client's mistake.
    with pytest.raises(openai.BadRequestError) as refused:
        embeddings.embed_documents(TEXTS[:2])
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    assert error["param"] == "input" and "vocabulary" in error["message"]


# --- plain HTTP: /classify and /v1/rerank ----------------------------------------------------------


def test_classify_gives_each_input_its_most_probable_label_and_every_probability(stack: Stack) -> None:
    body = {"model": CLASSIFIER, "input": TEXTS[:3]}
    reply = httpx.post(f"{stack.base_url}/classify", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["object"] == "list" and answer["model"] == CLASSIFIER
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    for item in answer["data"]:
        assert item["num_classes"] == len(CLASSIFIER_LABELS) == len(item["probs"])
        assert sum(item["probs"]) == pytest.approx(1.0, abs=1e-4)
        assert item["label"] == CLASSIFIER_LABELS[int(np.argmax(item["probs"]))]
    assert answer["usage"]["prompt_tokens"] > 3
    one = httpx.post(
        f"{stack.base_url}/v1/classify", json={"model": CLASSIFIER, "input": TEXTS[1]}, timeout=60
    )
    np.testing.assert_allclose(one.json()["data"][0]["probs"], answer["data"][1]["probs"], atol=1e-4)


def test_rerank_sorts_the_documents_by_relevance_with_their_indices(stack: Stack) -> None:
    documents = TEXTS[:5]
    body = {"model": RERANKER, "query": "Where is Paris?", "documents": documents}
    reply = httpx.post(f"{stack.base_url}/v1/rerank", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert sorted(result["index"] for result in results) == list(range(len(documents)))
    scores = [result["relevance_score"] for result in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < score < 1.0 for score in scores)
    assert len(set(scores)) == len(scores), "the demo reranker tells the documents apart"
    for result in results:
        assert result["document"]["text"] == documents[result["index"]]
    top = httpx.post(f"{stack.base_url}/v1/rerank", json={**body, "top_n": 2}, timeout=60).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert [r["relevance_score"] for r in top] == pytest.approx(scores[:2], abs=1e-4)


def test_the_answers_are_what_plain_transformers_computes_from_the_same_folders(
    stack: Stack, pooling_dirs: dict[str, Path], alone: dict[str, list[float]]
) -> None:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    text, query = TEXTS[1], "Where is Paris?"
    with torch.inference_mode():
        tokenizer = AutoTokenizer.from_pretrained(pooling_dirs["embed"])
        encoded = tokenizer(text, return_tensors="pt")
        hidden = AutoModel.from_pretrained(pooling_dirs["embed"])(**encoded).last_hidden_state[0]
        mean = hidden.mean(dim=0)  # one text: every token counts
        classifier = AutoModelForSequenceClassification.from_pretrained(pooling_dirs["classify"])
        probs = classifier(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0]
        reranker = AutoModelForSequenceClassification.from_pretrained(pooling_dirs["score"])
        logit = reranker(**tokenizer(query, text, return_tensors="pt")).logits[0, 0]
    assert cosine(alone[text], mean.numpy()) >= SAME_VECTOR_COSINE
    classified = httpx.post(
        f"{stack.base_url}/classify", json={"model": CLASSIFIER, "input": text}, timeout=60
    )
    np.testing.assert_allclose(classified.json()["data"][0]["probs"], probs.numpy(), atol=1e-4)
    body = {"model": RERANKER, "query": query, "documents": [{"text": text}], "return_documents": False}
    (result,) = httpx.post(f"{stack.base_url}/v2/rerank", json=body, timeout=60).json()["results"]
    assert result["relevance_score"] == pytest.approx(float(torch.sigmoid(logit)), abs=1e-4)
    assert result["index"] == 0 and "document" not in result


# --- bad inputs: each a 400 in OpenAI's error shape, before or after the queue ----------------------


# Not refused yet: the worker cuts the vector to `dimensions` and returns it whole when the model has
# fewer (128 values for 129 asked). Strict: once the worker refuses it, this marker must go.
@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_bad_request_gets_a_400_in_openais_shape_naming_the_parameter(stack: Stack, name: str) -> None:
    path, body, param = BAD_REQUESTS[name]
    reply = httpx.post(f"{stack.base_url}{path}", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    assert "code" in error


def test_past_the_context_is_refused_in_openais_words_and_a_foreign_token_id_by_name(stack: Stack) -> None:
    url = f"{stack.base_url}/v1/embeddings"
    too_long = httpx.post(url, json={"model": EMBEDDER, "input": TOO_LONG}, timeout=60).json()["error"]
    assert too_long["code"] == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in too_long["message"]
    foreign = httpx.post(url, json={"model": EMBEDDER, "input": [5, 100_000]}, timeout=60).json()["error"]
    assert "100000" in foreign["message"] and "vocabulary" in foreign["message"]


# --- the models, as clients and operators see them -------------------------------------------------


def test_v1_models_lists_every_kind(client: OpenAI) -> None:
    kinds = {card.id: getattr(card, "kind", None) for card in client.models.list()}
    assert kinds[EMBEDDER] == "embed" and kinds[WHOLE_EMBEDDER] == "embed"
    assert kinds[CLASSIFIER] == "classify" and kinds[RERANKER] == "score"
    assert kinds[MODEL] == "generate"


def test_switchboard_models_shows_the_embedder_like_an_llm(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show_models(stack.base_url) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    for name in (EMBEDDER, CLASSIFIER, RERANKER):
        assert rows[name][1] == "warm", rows[name]
        assert "@" in rows[name][2], "where it is loaded"
    assert rows[MODEL][1] == "cold" and rows[WHOLE_EMBEDDER][1] == "cold"
