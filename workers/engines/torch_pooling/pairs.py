"""A reranker's rows as the model reads them: its query's tokens paired with each document's.

The query is tokenized once, not once per document (a 64 KB query paired with 256 documents once
kept a reranker busy for 60 s while a small rerank beside it waited 59): each text is tokenized
alone, without special tokens, and the pair is put together as the tokenizer's pair template puts
it (`[CLS] query [SEP] document [SEP]` for BERT, with token types 0 and 1). Truncation keeps the
last tokens of each, longest first, by the same arithmetic as Hugging Face's tokenizers
(`truncate_encodings`, `longest_first`), so a pair's ids are the ones the tokenizer makes of both
texts together. The template is read from the tokenizer itself and checked at load; a tokenizer
whose pairs are not a template around the two texts is left to pair them itself (`PairTemplate.of`
answers None).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# Query tokenizations kept from batch to batch: a job's documents reach the model in batches of
# `max_batch_size` rows, each with the job's query.
QUERIES_KEPT = 8
# Two texts for reading the template, and two for checking it.
_PROBES = (("a", "b"), ("where is the fox?", "The quick brown fox, jumping."))


@dataclass(frozen=True)
class PairTemplate:
    """Where a pair's special tokens go around its two texts, and each part's token type."""

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    prefix_types: tuple[int, ...]
    middle_types: tuple[int, ...]
    suffix_types: tuple[int, ...]
    query_type: int
    document_type: int

    @property
    def added(self) -> int:
        """Special tokens the template adds to a pair."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    @classmethod
    def of(cls, tokenizer: Any) -> PairTemplate | None:
        """The tokenizer's pair template, read from a pair it makes, or None where its pairs are not
        its texts' own tokens with special tokens around them."""
        first, second = _PROBES[0]
        template = cls._read(tokenizer, first, second)
        if template is None:
            return None
        for query, document in _PROBES:
            pair = tokenizer(query, document)
            ids, types = template.pair(_ids(tokenizer, query), _ids(tokenizer, document))
            if ids != list(pair["input_ids"]) or types != list(pair.get("token_type_ids") or types):
                return None
        return template

    @classmethod
    def _read(cls, tokenizer: Any, query: str, document: str) -> PairTemplate | None:
        pair = tokenizer(query, document)
        ids = list(pair["input_ids"])
        types = list(pair.get("token_type_ids") or [0] * len(ids))
        query_ids, document_ids = _ids(tokenizer, query), _ids(tokenizer, document)
        start = _find(ids, query_ids, 0)
        if start < 0:
            return None
        between = start + len(query_ids)
        end = _find(ids, document_ids, between)
        if end < 0:
            return None
        after = end + len(document_ids)
        return cls(
            prefix=tuple(ids[:start]),
            middle=tuple(ids[between:end]),
            suffix=tuple(ids[after:]),
            prefix_types=tuple(types[:start]),
            middle_types=tuple(types[between:end]),
            suffix_types=tuple(types[after:]),
            query_type=types[start],
            document_type=types[end],
        )

    def pair(self, query: list[int], document: list[int]) -> tuple[list[int], list[int]]:
        """The pair's token ids and token types."""
        ids = [*self.prefix, *query, *self.middle, *document, *self.suffix]
        types = [
            *self.prefix_types,
            *[self.query_type] * len(query),
            *self.middle_types,
            *[self.document_type] * len(document),
            *self.suffix_types,
        ]
        return ids, types

    def kept_pair(
        self, query: list[int], document: list[int], keep: int | None, query_longer: bool | None = None
    ) -> tuple[list[int], list[int]]:
        """The pair, cut to its last `keep` tokens (None: whole) as the tokenizer cuts a pair;
        `query_longer` as for `longest_first`."""
        if keep is None:
            return self.pair(query, document)
        budget = keep - self.added
        if budget <= 0:
            # Fewer tokens kept than the template's own: the pair's last ones, as the runner keeps them.
            ids, types = self.pair(query, document)
            return ids[-keep:], types[-keep:]
        query_kept, document_kept = longest_first(len(query), len(document), budget, query_longer)
        return self.pair(query[len(query) - query_kept :], document[len(document) - document_kept :])


def longest_first(
    query: int, document: int, budget: int, query_longer: bool | None = None
) -> tuple[int, int]:
    """How many tokens of each text a pair keeps within `budget` (the tokens left beside the special
    ones): Hugging Face tokenizers' `longest_first`, which cuts the longer text first and, where both
    are too long, keeps half the budget of each (the odd token to the longer text, to the document
    when they are as long). `query_longer` says which text is the longer where their token counts
    cannot (a text cut before tokenizing is longer than it now counts)."""
    if query + document <= budget:
        return query, document
    swapped = query > document if query_longer is None else query_longer
    shorter, longer = (document, query) if swapped else (query, document)
    longer = shorter if shorter > budget else max(shorter, budget - shorter)
    if shorter + longer > budget:
        shorter = budget // 2
        longer = shorter + budget % 2
    kept = (longer, shorter) if swapped else (shorter, longer)
    return min(query, kept[0]), min(document, kept[1])


class QueryTokens:
    """The token ids of the last few queries (and their cut), so that a query is tokenized once per job."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._kept: OrderedDict[str, list[int]] = OrderedDict()

    def ids(self, query: str) -> list[int]:
        """The query's token ids, without special tokens."""
        ids = self._kept.get(query)
        if ids is None:
            ids = _ids(self._tokenizer, query)
            self._kept[query] = ids
            if len(self._kept) > QUERIES_KEPT:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(query)
        return ids


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    for position in range(start, len(haystack) - len(needle) + 1):
        if haystack[position : position + len(needle)] == needle:
            return position
    return -1
