"""A pooling row's input as the model reads it: token ids (and token types), checked and truncated.

Text goes through the model's tokenizer with its special tokens (a pair for a reranker: the query,
then the document, through the tokenizer's pair template); token ids given by the client are used as
given, once checked against the vocabulary. An input longer than the model's context is the client's
error unless the row asks for truncation, which keeps its last tokens as vLLM's
`truncate_prompt_tokens` does (-1: as many as the model takes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from switchboard import context_length
from switchboard.wire import ModelLimits
from workers.engines.base import InvalidEngineRequest, PoolingRow

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

    def encode_all(self, rows: Sequence[PoolingRow]) -> list[EncodedRow | InvalidEngineRequest]:
        """Each row's token ids, or its refusal, in order. Single texts that keep every token (the
        usual embedding or classification) go through the tokenizer in one call, so that its Rust
        side loops over them rather than Python (one call per row took a sixth of a batch's time)."""
        encoded: list[EncodedRow | InvalidEngineRequest] = []
        plain: list[tuple[int, str]] = []
        for row in rows:
            refusal = _plain_text_refusal(self.limits, row)
            if isinstance(row.input, str) and row.task != "score" and row.truncate_prompt_tokens is None:
                if refusal is None:
                    plain.append((len(encoded), row.input))
                encoded.append(refusal or EncodedRow(ids=[], types=None))  # filled in below
            else:
                encoded.append(self._encoded_or_refusal(row))
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

    def _encoded_or_refusal(self, row: PoolingRow) -> EncodedRow | InvalidEngineRequest:
        try:
            return self.encode(row)
        except InvalidEngineRequest as refusal:
            return refusal

    def _encoded_or_refusal_of(self, encoded: EncodedRow) -> EncodedRow | InvalidEngineRequest:
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
        texts = (row.query or "", row.input) if row.task == "score" else (row.input,)
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


def _plain_text_refusal(limits: ModelLimits, row: PoolingRow) -> InvalidEngineRequest | None:
    """A single text that keeps every token, refused from its length in characters alone."""
    if not isinstance(row.input, str) or row.task == "score" or row.truncate_prompt_tokens is not None:
        return None
    refusal = context_length.text_refusal(limits, len(row.input), PARAM)
    return InvalidEngineRequest(refusal.message, param=refusal.param, code=refusal.code) if refusal else None


def _refuse(refusal: context_length.Refusal | None) -> None:
    if refusal is not None:
        raise InvalidEngineRequest(refusal.message, param=refusal.param, code=refusal.code)
