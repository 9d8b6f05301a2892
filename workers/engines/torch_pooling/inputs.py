"""A pooling row's input as the model reads it: token ids (and token types), checked and truncated.

Text goes through the model's tokenizer with its special tokens (a pair for a reranker: the query,
then the document, through the tokenizer's pair template); token ids given by the client are used as
given, once checked against the vocabulary. An input longer than the model's context is the client's
error unless the row asks for truncation, which keeps its last tokens as vLLM's
`truncate_prompt_tokens` does (-1: as many as the model takes); a text is first cut to what those
tokens can span (`switchboard.kept_text`), so that the tokenizer never reads what it would drop.
A reranker's query is tokenized once for all its documents (`pairs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from switchboard import context_length
from switchboard.kept_text import kept_tail
from switchboard.wire import ModelLimits
from workers.engines.base import InvalidEngineRequest, PoolingRow
from workers.engines.torch_pooling.pairs import PairTemplate, QueryTokens

PARAM = "input"


@dataclass(frozen=True)
class EncodedRow:
    """A row's token ids, and its token types where the model reads them (pairs: 0 query, 1 document)."""

    ids: list[int]
    types: list[int] | None


class RowEncoder:
    """Turns pooling rows into the token ids one model reads, refusing what it cannot take."""

    def __init__(self, tokenizer: Any, *, model_name: str, limits: ModelLimits) -> None:
        self._tokenizer = tokenizer
        self._model_name = model_name
        self.limits = limits
        # Only when a row asks for truncation, and then it keeps the end of the text.
        tokenizer.truncation_side = "left"
        self._types = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        self._pairs = PairTemplate.of(tokenizer)
        self._queries = QueryTokens(tokenizer)

    def encode_all(self, rows: Sequence[PoolingRow]) -> list[EncodedRow | InvalidEngineRequest]:
        """Each row's token ids, or its refusal, in order. Single texts that keep every token (the
        usual embedding or classification) go through the tokenizer in one call, so that its Rust
        side loops over them rather than Python (one call per row took a sixth of a batch's time)."""
        encoded: list[EncodedRow | InvalidEngineRequest] = []
        plain: list[tuple[int, str]] = []
        pairs: list[int] = []
        for row in rows:
            refusal = _plain_text_refusal(self.limits, row)
            if isinstance(row.input, str) and row.task != "score" and row.truncate_prompt_tokens is None:
                if refusal is None:
                    plain.append((len(encoded), row.input))
                encoded.append(refusal or EncodedRow(ids=[], types=None))  # filled in below
            elif isinstance(row.input, str) and row.task == "score" and self._pairs is not None:
                pairs.append(len(encoded))
                encoded.append(EncodedRow(ids=[], types=None))  # filled in below
            else:
                encoded.append(self._encoded_or_refusal(row))
        if pairs and self._pairs is not None:
            self._encode_pairs(self._pairs, rows, pairs, encoded)
        if plain:
            batch = self._tokenizer([text for _, text in plain])
            types = batch["token_type_ids"] if self._types and "token_type_ids" in batch else None
            for position, (index, _) in enumerate(plain):
                ids = list(batch["input_ids"][position])
                row_types = (
                    list(types[position]) if types is not None else [0] * len(ids) if self._types else None
                )
                encoded[index] = self._encoded_or_refusal_of(EncodedRow(ids=ids, types=row_types))
        return encoded

    def _encode_pairs(
        self,
        template: PairTemplate,
        rows: Sequence[PoolingRow],
        indices: list[int],
        encoded: list[EncodedRow | InvalidEngineRequest],
    ) -> None:
        """The reranker's rows at `indices`: each query tokenized once, the documents in one call."""
        texts: list[tuple[int, int | None, str, str, bool | None]] = []
        for index in indices:
            row = rows[index]
            assert isinstance(row.input, str)
            try:
                keep = self._kept_tokens(row.truncate_prompt_tokens)
                query, document = self._cut(row.query or "", keep), self._cut(row.input, keep)
                if keep is None:
                    _refuse(context_length.text_refusal(self.limits, len(document) + len(query), PARAM))
            except InvalidEngineRequest as refusal:
                encoded[index] = refusal
                continue
            texts.append((index, keep, query, document, _query_longer(row, query, document)))
        if not texts:
            return
        documents = self._tokenizer([document for _, _, _, document, _ in texts], add_special_tokens=False)
        for (index, keep, query, _, longer), document_ids in zip(texts, documents["input_ids"], strict=True):
            ids, types = template.kept_pair(self._queries.ids(query), list(document_ids), keep, longer)
            encoded[index] = self._encoded_or_refusal_of(
                EncodedRow(ids=ids, types=types if self._types else None), keep
            )

    def _cut(self, text: str, keep: int | None) -> str:
        """`text` cut to what its last `keep` tokens can span (None: whole)."""
        return text if keep is None else kept_tail(text, keep, self.limits.max_token_chars)

    def _encoded_or_refusal(self, row: PoolingRow) -> EncodedRow | InvalidEngineRequest:
        try:
            return self.encode(row)
        except InvalidEngineRequest as refusal:
            return refusal

    def _encoded_or_refusal_of(
        self, encoded: EncodedRow, keep: int | None = None
    ) -> EncodedRow | InvalidEngineRequest:
        """`encoded`, or its refusal where it keeps every token (`keep` None) and they are too many."""
        if keep is not None:
            return encoded
        try:
            self._refuse_too_long(len(encoded.ids))
        except InvalidEngineRequest as refusal:
            return refusal
        return encoded

    def encode(self, row: PoolingRow) -> EncodedRow:
        """The row's token ids, refused (InvalidEngineRequest) where the model cannot take them."""
        keep = self._kept_tokens(row.truncate_prompt_tokens)
        if isinstance(row.input, tuple):
            if row.task == "score":
                raise InvalidEngineRequest(
                    f"{self._model_name} scores documents given as text, not as token ids.", param=PARAM
                )
            return self._given_ids(list(row.input), keep)
        if keep is None:
            query_chars = len(row.query or "")
            _refuse(context_length.text_refusal(self.limits, len(row.input) + query_chars, PARAM))
        encoded = self._tokenize(row, keep)
        if keep is None:
            self._refuse_too_long(len(encoded.ids))
        return encoded

    def _kept_tokens(self, truncate: int | None) -> int | None:
        """How many tokens a row keeps at most; None: all, and a row too long is refused."""
        if truncate is None:
            return None
        context = self.limits.max_model_len
        if truncate == -1:
            return context
        if truncate < 1 or truncate > context:
            raise InvalidEngineRequest(
                f"`truncate_prompt_tokens` must be -1 or from 1 to the model's maximum context length "
                f"({context} tokens); it is {truncate}.",
                param="truncate_prompt_tokens",
                code="invalid_value",
            )
        return truncate

    def _given_ids(self, ids: list[int], keep: int | None) -> EncodedRow:
        if not ids:
            raise InvalidEngineRequest(
                "An input of token ids holds no token.", param=PARAM, code="invalid_value"
            )
        vocab = self.limits.vocab_size
        outside = [token for token in ids if not 0 <= token < vocab]
        if outside:
            raise InvalidEngineRequest(
                f"The input holds token ids outside the vocabulary of {self._model_name}, whose "
                f"{vocab} tokens are numbered 0 to {vocab - 1}: {outside[:5]}.",
                param=PARAM,
                code="invalid_value",
            )
        if keep is not None:
            ids = ids[-keep:]
        else:
            self._refuse_too_long(len(ids))
        return EncodedRow(ids=ids, types=[0] * len(ids) if self._types else None)

    def _tokenize(self, row: PoolingRow, keep: int | None) -> EncodedRow:
        assert isinstance(row.input, str)
        document = self._cut(row.input, keep)
        texts = (self._cut(row.query or "", keep), document) if row.task == "score" else (document,)
        specials = self._tokenizer.num_special_tokens_to_add(pair=len(texts) == 2)
        cut = keep is not None and keep > specials
        encoding = self._tokenizer(*texts, truncation=cut, max_length=keep if cut else None)
        ids = list(encoding["input_ids"])
        types = list(encoding["token_type_ids"]) if self._types and "token_type_ids" in encoding else None
        if keep is not None and len(ids) > keep:
            # Fewer tokens kept than the template's own special tokens: the last ones, as given ids.
            ids, types = ids[-keep:], types[-keep:] if types is not None else None
        if self._types and types is None:
            types = [0] * len(ids)
        return EncodedRow(ids=ids, types=types)

    def _refuse_too_long(self, tokens: int) -> None:
        context = self.limits.max_model_len
        if tokens > context:
            raise InvalidEngineRequest(
                f"This model's maximum context length is {context} tokens, and an input of `{PARAM}` "
                f"takes {tokens} tokens. Shorten it, or set `truncate_prompt_tokens`.",
                param=PARAM,
                code=context_length.CONTEXT_LENGTH_EXCEEDED,
            )


def _query_longer(row: PoolingRow, query: str, document: str) -> bool | None:
    """Which of a pair's texts is the longer, where one was cut before tokenizing (then its tokens no
    longer say): the cut one, or of two cut, the longer in characters; None where neither was."""
    whole_query, whole_document = row.query or "", row.input
    assert isinstance(whole_document, str)
    query_cut, document_cut = len(query) < len(whole_query), len(document) < len(whole_document)
    if query_cut and document_cut:
        return len(whole_query) > len(whole_document)
    if query_cut or document_cut:
        return query_cut
    return None


def _plain_text_refusal(limits: ModelLimits, row: PoolingRow) -> InvalidEngineRequest | None:
    """A single text that keeps every token, refused from its length in characters alone."""
    if not isinstance(row.input, str) or row.task == "score" or row.truncate_prompt_tokens is not None:
        return None
    refusal = context_length.text_refusal(limits, len(row.input), PARAM)
    return InvalidEngineRequest(refusal.message, param=refusal.param, code=refusal.code) if refusal else None


def _refuse(refusal: context_length.Refusal | None) -> None:
    if refusal is not None:
        raise InvalidEngineRequest(refusal.message, param=refusal.param, code=refusal.code)
