"""The pooling requests' checks of one body and of one answer's size: each bound's 400 names the
parameter at fault; texts that keep their last tokens are cut where a word begins, keeping them."""

from __future__ import annotations

import pytest

from router.openai.classify import ClassificationRequest
from router.openai.embeddings import EmbeddingRequest
from router.openai.errors import InvalidRequestError
from router.openai.pooling_checks import (
    check_classification_request,
    check_embedding_request,
    check_pooling_output,
    check_rerank_request,
)
from router.openai.rerank import RerankRequest
from switchboard.config import FrontDoorConfig, ModelConfig
from switchboard.kept_text import CUT_SLACK_CHARS, front_door_cut, kept_tail
from switchboard.wire import ModelLimits, PoolingTask

BOUNDS = FrontDoorConfig(max_rerank_query_chars=1024, max_pooling_output_values=4096)
EMBEDDER = ModelConfig(name="e", path="/nonexistent", kind="embed")


def refusal(check: object, *args: object) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as raised:
        check(*args)  # type: ignore[operator]
    return raised.value


def test_each_request_gives_its_inputs_as_they_will_be_sent() -> None:
    assert check_embedding_request(EmbeddingRequest(model="e", input=["a", [1, 2]]), BOUNDS) == ("a", (1, 2))
    assert check_classification_request(ClassificationRequest(model="c", input="a"), BOUNDS) == ("a",)
    documents = check_rerank_request(
        RerankRequest(model="r", query="q", documents=["a", {"text": "b"}]), BOUNDS
    )
    assert documents == ("a", "b")


def test_a_rerank_query_longer_than_the_bound_is_refused_truncated_or_not() -> None:
    for truncate in (None, 8):
        body = RerankRequest(model="r", query="q" * 1025, documents=["a"], truncate_prompt_tokens=truncate)
        error = refusal(check_rerank_request, body, BOUNDS)
        assert error.param == "query" and "1,025 characters long; at most 1,024" in str(error)
    check_rerank_request(RerankRequest(model="r", query="q" * 1024, documents=["a"]), BOUNDS)


def test_an_answer_of_more_values_than_the_bound_is_refused_naming_what_to_lower() -> None:
    body = EmbeddingRequest(model="e", input=["a"] * 9, dimensions=512)
    error = refusal(check_embedding_request, body, BOUNDS)
    assert error.param == "dimensions" and "9 embeddings of 512 dimensions are 4,608 values" in str(error)
    # Once the model is known, its own size where no `dimensions` is asked for.
    limits = ModelLimits(max_model_len=512, vocab_size=400, max_token_chars=8, embedding_size=1024)
    error = refusal(check_pooling_output, EMBEDDER, 5, None, BOUNDS, limits)
    assert error.param == "input" and "Ask for fewer inputs" in str(error)
    check_pooling_output(EMBEDDER, 4, None, BOUNDS, limits)
    check_pooling_output(EMBEDDER, 5, None, BOUNDS, None)  # its size not known yet
    reranker = ModelConfig(name="r", path="/nonexistent", kind="score")
    check_pooling_output(reranker, 2048, None, FrontDoorConfig(), limits)


def test_the_defaults_admit_every_input_count_of_a_4096_dimension_embedder() -> None:
    limits = ModelLimits(max_model_len=512, vocab_size=400, max_token_chars=8, embedding_size=4096)
    check_pooling_output(EMBEDDER, 2048, None, FrontDoorConfig(), limits)


def test_a_text_is_cut_where_a_word_begins_before_what_its_last_tokens_span() -> None:
    text = "word " * 1000 + "end"
    kept = kept_tail(text, 10, 4)
    assert text.endswith(kept) and kept.startswith(" word") and not kept[1:].startswith(" ")
    assert 40 <= len(kept) <= 40 + CUT_SLACK_CHARS
    assert kept_tail("short text", 10, 4) == "short text"
    blob = "x" * 10_000
    assert kept_tail(blob, 10, 4) == "x" * (40 + CUT_SLACK_CHARS)


def test_a_task_is_cut_only_where_it_keeps_a_known_number_of_tokens() -> None:
    long = "word " * 10_000
    for truncate in (None, -1):
        task = PoolingTask(task="score", inputs=(long,), query=long, truncate_prompt_tokens=truncate)
        assert front_door_cut(task) is task
    cut = front_door_cut(
        PoolingTask(task="score", inputs=(long, (1, 2)), query=long, truncate_prompt_tokens=4)
    )
    assert cut.query is not None and len(cut.query) < 600 and cut.inputs[1] == (1, 2)
    assert isinstance(cut.inputs[0], str) and len(cut.inputs[0]) < 600
