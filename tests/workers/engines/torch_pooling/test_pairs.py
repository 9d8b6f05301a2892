"""A reranker's rows built from its query tokenized once: the pairs are the tokenizer's own (whole or
truncated, longest first), the query is tokenized once per job however many documents and batches it
has, a long query with truncation never reaches the tokenizer whole, and it crosses Triton once per
request rather than once per row."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from switchboard.kept_text import CUT_SLACK_CHARS
from switchboard.local.demo_pooling_models import build_demo_reranker
from switchboard.wire import ModelLimits
from workers.engines.base import InvalidEngineRequest, PoolingRow
from workers.engines.prompts import longest_token_chars
from workers.engines.torch_pooling.inputs import EncodedRow, RowEncoder
from workers.engines.torch_pooling.pairs import PairTemplate, longest_first
from workers.triton.pooling.model import decoded_rows, encoded_rows

transformers = pytest.importorskip("transformers")

CONTEXT = 512
WORDS = [
    "where",
    "is",
    "the",
    "fox",
    "quick",
    "brown",
    "jumps",
    "over",
    "lazy",
    "dog",
    "Paris",
    "France",
    "river",
    "bank",
]


class CountingTokenizer:
    """The reranker's tokenizer, counting the texts it is given (a stand-in around the real one)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.texts: list[str] = []

    def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        for item in [text, *args]:
            self.texts.extend(item if isinstance(item, list) else [item])
        return self._tokenizer(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_tokenizer", "texts"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._tokenizer, name, value)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = build_demo_reranker(tmp_path_factory.mktemp("reranker") / "score")
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    loaded.model_max_length = 2**31 - 1
    return loaded


def encoder_of(tokenizer: Any) -> RowEncoder:
    limits = ModelLimits(
        max_model_len=CONTEXT, vocab_size=400, max_token_chars=longest_token_chars(tokenizer)
    )
    return RowEncoder(tokenizer, model_name="score", limits=limits)


def text(words: int, seed: int) -> str:
    chosen = random.Random(seed)
    return " ".join(chosen.choice(WORDS) for _ in range(words))


def rerank(query: str, document: str, keep: int | None = None) -> PoolingRow:
    return PoolingRow(task="score", input=document, query=query, truncate_prompt_tokens=keep)


def test_the_template_is_read_from_the_tokenizer(tokenizer: Any) -> None:
    template = PairTemplate.of(tokenizer)
    assert template is not None
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert (template.prefix, template.middle, template.suffix) == ((cls,), (sep,), (sep,))
    assert (template.query_type, template.document_type, template.suffix_types) == (0, 1, (1,))


def test_pairs_are_the_tokenizers_own_whole_and_truncated(tokenizer: Any) -> None:
    """Against the tokenizer pairing both texts itself (what every row cost before), over lengths on
    both sides of every case of longest-first truncation, an odd and an even budget each."""
    encoder = encoder_of(tokenizer)
    tokenizer.truncation_side = "left"
    cases = [
        (text(q, seed=q), text(d, seed=1000 + d), keep)
        for q in (1, 7, 60, 300)
        for d in (1, 8, 61, 250)
        for keep in (None, 2, 3, 4, 64, 65, 511)
    ]
    rows = [rerank(query, document, keep) for query, document, keep in cases]
    built = encoder.encode_all(rows)
    for (query, document, keep), row in zip(cases, built, strict=True):
        if keep is not None and keep <= 3:
            whole = tokenizer(query, document)
            expected_ids, expected_types = whole["input_ids"][-keep:], whole["token_type_ids"][-keep:]
        else:
            pair = tokenizer(query, document, truncation=keep is not None, max_length=keep)
            expected_ids, expected_types = pair["input_ids"], pair["token_type_ids"]
        if keep is None and len(expected_ids) > CONTEXT:
            assert isinstance(row, InvalidEngineRequest) and row.code == "context_length_exceeded"
        else:
            assert row == EncodedRow(ids=list(expected_ids), types=list(expected_types)), (len(query), keep)


def test_longest_first_keeps_what_hugging_faces_truncation_keeps() -> None:
    # Fits; the shorter whole and the longer cut; both cut, the odd token to the longer (the document
    # when they are as long).
    assert longest_first(3, 4, 10) == (3, 4)
    assert longest_first(2, 40, 9) == (2, 7)
    assert longest_first(40, 2, 9) == (7, 2)
    assert longest_first(30, 40, 9) == (4, 5)
    assert longest_first(40, 30, 9) == (5, 4)
    assert longest_first(20, 20, 9) == (4, 5)


def test_the_query_is_tokenized_once_for_all_its_documents_and_batches(tokenizer: Any) -> None:
    counting = CountingTokenizer(tokenizer)
    encoder = encoder_of(counting)
    counting.texts.clear()
    query = "where is the fox " * 20
    for batch in range(4):  # a job's 256 documents, in batches of 64 rows
        rows = [rerank(query, text(30, seed=batch * 64 + i), keep=128) for i in range(64)]
        assert not any(isinstance(row, InvalidEngineRequest) for row in encoder.encode_all(rows))
    assert counting.texts.count(query) == 1
    # Every document once, in one call per batch.
    assert len(counting.texts) == 1 + 256


def test_a_long_query_with_truncation_reaches_the_tokenizer_cut_and_finishes_fast(tokenizer: Any) -> None:
    counting = CountingTokenizer(tokenizer)
    encoder = encoder_of(counting)
    counting.texts.clear()
    query = text(13_000, seed=1)[: 64 * 1024]
    rows = [rerank(query, text(40, seed=i), keep=64) for i in range(256)]
    started = time.perf_counter()
    built = encoder.encode_all(rows)
    took_s = time.perf_counter() - started
    assert all(isinstance(row, EncodedRow) and len(row.ids) == 64 for row in built)
    longest_read = max(len(item) for item in counting.texts)
    assert longest_read <= 64 * encoder.limits.max_token_chars + CUT_SLACK_CHARS
    # The query's last tokens, as the tokenizer keeps them of the whole query.
    tokenizer.truncation_side = "left"
    whole = tokenizer(query, rows[0].input, truncation=True, max_length=64)["input_ids"]
    assert isinstance(built[0], EncodedRow) and built[0].ids == list(whole)
    assert took_s < 1.0, took_s  # tokenizing the whole query per document took 60 s


def test_the_query_crosses_once_per_request_and_each_row_gets_it_back() -> None:
    first, second = "q" * 10_000, "another query"
    rows = [
        *(rerank(first, f"document {i}") for i in range(50)),
        *(rerank(second, f"other {i}") for i in range(3)),
        PoolingRow(task="embed", input="an embedding between"),
        rerank(second, "after it"),
    ]
    sent = list(encoded_rows(rows))
    assert sum(len(item) for item in sent) < len(first) + 50 * 100
    assert decoded_rows(sent) == rows
