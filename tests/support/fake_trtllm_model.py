"""The "weights" of the TensorRT-LLM stand-in: a deterministic random language model over a real vocabulary.

The logits at a position depend only on the context (the last tokens and the length), so greedy
decoding repeats itself, a seed repeats a sample and different seeds differ, and log probabilities
are real ones (log-softmax of those logits). Guided decoding is honoured the way TensorRT-LLM's
xgrammar backend honours it: the text generated is a valid document of the guide (built here from
the JSON schema, then tokenized), followed by the end token.
"""

from __future__ import annotations

import json
import re
import string
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

# How many of the last tokens (with the length) decide the next logits.
CONTEXT_WINDOW = 4
LOGIT_SCALE = 2.0


class ToyModel:
    """Logits, sampling and log probabilities over `vocab_size` tokens."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def logits(self, context: Sequence[int]) -> np.ndarray:
        """The logits after `context`: the same context, the same logits."""
        window = np.asarray(list(context[-CONTEXT_WINDOW:]), dtype=np.int64).tobytes()
        rng = np.random.default_rng([zlib.crc32(window), len(context)])
        return rng.standard_normal(self.vocab_size) * LOGIT_SCALE

    def next_token(
        self,
        context: Sequence[int],
        params: Any,
        rng: np.random.Generator,
        *,
        bias: np.ndarray | None,
        banned: Sequence[int] = (),
    ) -> tuple[int, np.ndarray]:
        """The next token under `params` (greedy or sampled), and the log-probabilities it came from."""
        logits = self.logits(context)
        if bias is not None:
            logits = logits + bias
        for token in banned:
            logits[token] = -np.inf
        logprobs = log_softmax(logits)
        if params._greedy_decoding:
            return int(np.argmax(logits)), logprobs
        temperature = params.temperature if params.temperature is not None else 1.0
        probs = np.exp(log_softmax(logits / temperature))
        probs = _truncate(probs, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
        return int(rng.choice(self.vocab_size, p=probs)), logprobs


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of `logits` (-inf stays -inf)."""
    finite = logits[np.isfinite(logits)]
    shifted = logits - (finite.max() if finite.size else 0.0)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.exp(shifted).sum())


def top_logprobs(logprobs: np.ndarray, k: int, chosen: int | None) -> dict[int, tuple[float, int]]:
    """The `k` most likely tokens with their log probability and rank (1 is the likeliest), and
    `chosen` with its own rank where it is not among them."""
    order = np.argsort(-logprobs, kind="stable")
    ranked = {int(token): (float(logprobs[token]), rank + 1) for rank, token in enumerate(order[:k])}
    if chosen is not None and chosen not in ranked:
        rank = int(np.sum(logprobs > logprobs[chosen])) + 1
        ranked[chosen] = (float(logprobs[chosen]), rank)
    return ranked


def _truncate(
    probs: np.ndarray, *, top_k: int | None, top_p: float | None, min_p: float | None
) -> np.ndarray:
    keep = np.ones_like(probs, dtype=bool)
    order = np.argsort(-probs, kind="stable")
    if top_k:
        keep[order[top_k:]] = False
    if top_p is not None and top_p < 1.0:
        cumulative = np.cumsum(probs[order])
        keep[order[np.searchsorted(cumulative, top_p) + 1 :]] = False
    if min_p:
        keep &= probs >= min_p * probs.max()
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum()


# --- guided decoding ---------------------------------------------------------------------------


class UnsupportedGuide(ValueError):
    """A guide the stand-in cannot generate a document for (the real backend could)."""


def guide_refusal(guide: Any) -> str | None:
    """Why xgrammar cannot compile `guide` (a GuidedDecodingParams), or None where it can (or where
    xgrammar is not installed: then every guide passes).

    TensorRT-LLM 1.2's `XGrammarMatcherFactory.create` (`_torch/pyexecutor/grammar_matcher.py`) hands
    the guide to xgrammar's compiler as a JSON schema, a regex or an EBNF grammar; xgrammar's parsers
    refuse what the compiler would (a lookbehind or a NUL in a regex, a grammar that does not parse),
    with the same messages, so the real parsers stand in for the compiler.
    """
    try:
        import xgrammar
    except ImportError:
        return None
    try:
        if guide.json is not None:
            schema = guide.json if isinstance(guide.json, str) else json.dumps(guide.json)
            xgrammar.Grammar.from_json_schema(schema)
        elif guide.regex is not None:
            xgrammar.Grammar.from_regex(guide.regex)
        elif guide.grammar is not None:
            xgrammar.Grammar.from_ebnf(guide.grammar)
    except Exception as exc:  # xgrammar raises RuntimeError from its native parsers
        return str(exc)
    return None


def guided_text(guide: Any, rng: np.random.Generator) -> str:
    """A text that satisfies `guide` (a GuidedDecodingParams), as xgrammar would let a model write."""
    if guide.json_object:
        return _compact({"answer": _word(rng, 1, 6)})
    if guide.json is not None:
        schema = guide.json if isinstance(guide.json, dict) else json.loads(guide.json)
        return _compact(document(schema, rng))
    if guide.regex is not None:
        choices = _alternatives(guide.regex)
        if choices is None:
            raise UnsupportedGuide(f"the stand-in writes only alternations of literals, not {guide.regex!r}")
        return choices[int(rng.integers(len(choices)))]
    raise UnsupportedGuide("the stand-in writes no grammar or structural tag documents")


def document(schema: dict[str, Any], rng: np.random.Generator) -> Any:
    """A JSON value valid under `schema` (objects, arrays, enums, strings, numbers, booleans)."""
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: document(sub, rng) for name, sub in properties.items()}
    if kind == "array":
        count = int(rng.integers(schema.get("minItems", 1), schema.get("maxItems", 3) + 1))
        return [document(schema.get("items", {"type": "integer"}), rng) for _ in range(count)]
    if kind == "string":
        return _string(schema, rng)
    if kind == "integer":
        return int(rng.integers(schema.get("minimum", 0), schema.get("maximum", 99) + 1))
    if kind == "number":
        return round(float(rng.uniform(schema.get("minimum", 0), schema.get("maximum", 10))), 2)
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "null":
        return None
    raise UnsupportedGuide(f"the stand-in writes no {kind!r} values")


def _string(schema: dict[str, Any], rng: np.random.Generator) -> str:
    shortest, longest = schema.get("minLength", 1), schema.get("maxLength", 8)
    pattern = schema.get("pattern")
    for _ in range(500):
        candidate = _word(rng, shortest, longest)
        if pattern is None or re.search(pattern, candidate):
            return candidate
    raise UnsupportedGuide(f"the stand-in found no lowercase word matching {pattern!r}")


def _word(rng: np.random.Generator, shortest: int, longest: int) -> str:
    length = int(rng.integers(shortest, longest + 1))
    return "".join(string.ascii_lowercase[int(i)] for i in rng.integers(26, size=length))


def _alternatives(regex: str) -> list[str] | None:
    """The literals of `(a|b|c)` (escaped as re.escape writes them), None for any other regex."""
    match = re.fullmatch(r"\((.*)\)", regex, flags=re.DOTALL)
    if match is None:
        return None
    parts = re.split(r"(?<!\\)\|", match.group(1))
    literals = [re.sub(r"\\(.)", r"\1", part) for part in parts]
    if any(re.escape(literal) != part for literal, part in zip(literals, parts, strict=True)):
        return None
    return literals


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
