"""A cascade's draft, judged: the cheap model's whole answer is kept, or the strong model answers.

A draft is kept when it finished normally, fits the structure the client asked for, and is confident
enough: the mean log-probability of the tokens it generated is at least the cascade's
`min_mean_logprob` (`switchboard.config.pipelines.CascadeConfig`). The draft is always asked for its
tokens' log-probabilities (`draft_sampling`); the client gets them only if it asked
(`client_chunks`). Whichever model answers, the answer's usage counts every step's tokens.

The structure checked is what the job's `StructuredOutput` says of JSON (`json_object`, or a JSON
Schema from `response_format`, `structured_outputs` or a forced tool choice): the engine's grammar
should already hold the draft to it, but a draft cut short, or a grammar the engine could not hold
exactly, yields text that is not the requested JSON. Regular expressions, choices and grammars are
left to the engine.
"""

from __future__ import annotations

import contextlib
import gc
import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from jsonschema import validators
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

from router.routing.pipelines.spent_tokens import usage_added
from switchboard.wire import Chunk, SamplingParams, StructuredOutput, Usage

# What a draft's text must be: the job's own constraint (only its JSON kinds are checked here).
Structure = StructuredOutput

ACCEPTED = "accepted"
# Finish reasons of a choice that ended by itself (tool calls parsed from the text end as "stop").
NORMAL_FINISHES = frozenset({"stop", "tool_calls"})
# A reason quotes at most this much of a parser's or validator's message (which may quote the text).
REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class DraftVerdict:
    """Whether a draft is kept, why not, and its mean token log-probability (None: none known)."""

    accepted: bool
    reason: str
    mean_logprob: float | None


def judge_draft(
    chunks: Sequence[Chunk], *, min_mean_logprob: float, structure: Structure | None, length_is_normal: bool
) -> DraftVerdict:
    """The verdict on a draft's whole answer (every chunk up to its last).

    `length_is_normal`: the client set `max_tokens` itself, so a choice cut at that length is the
    answer it asked for. The checks run in order (failure, finish, structure, confidence); the first
    that fails is the reason.
    """
    mean = mean_logprob(chunks)
    reason = _failure(chunks) or _unfinished(chunks, length_is_normal) or _unstructured(chunks, structure)
    if reason is None:
        reason = _unconfident(mean, min_mean_logprob)
    if reason is not None:
        return DraftVerdict(accepted=False, reason=reason, mean_logprob=mean)
    return DraftVerdict(accepted=True, reason=ACCEPTED, mean_logprob=mean)


def draft_failed(message: str) -> DraftVerdict:
    """The verdict on a draft whose run failed (its deadline passed, its results were lost)."""
    return DraftVerdict(accepted=False, reason=_cut(f"the draft failed: {message}"), mean_logprob=None)


def draft_too_slow(hold_s: float) -> DraftVerdict:
    """The verdict on a draft not finished within the cascade's `hold_s`."""
    return DraftVerdict(accepted=False, reason=f"the draft took longer than {hold_s:g} s", mean_logprob=None)


def mean_logprob(chunks: Iterable[Chunk]) -> float | None:
    """The mean log-probability of every token of every choice that carries one; None if none does."""
    values = [entry.logprob for chunk in chunks for entry in chunk.logprobs if entry.logprob is not None]
    return sum(values) / len(values) if values else None


def draft_sampling(sampling: SamplingParams) -> SamplingParams:
    """The client's sampling for the draft job: with each generated token's own log-probability at
    least (vLLM's `logprobs=0`), which the verdict needs; alternatives only if the client asked."""
    if sampling.logprobs is not None:
        return sampling
    return msgspec.structs.replace(sampling, logprobs=0)


def client_chunks(
    chunks: Iterable[Chunk], *, wanted_logprobs: bool, extra_usage: Usage | None
) -> list[Chunk]:
    """A kept draft's chunks as its client gets them: without the log-probabilities it did not ask
    for (a chunk carrying only those would be an empty event), its usage counting `extra_usage` too
    (what earlier steps spent)."""
    kept = []
    for chunk in chunks:
        if not wanted_logprobs and chunk.logprobs:
            chunk = msgspec.structs.replace(chunk, logprobs=())
        kept.append(usage_added(chunk, extra_usage))
    return kept


# --- the checks: each returns why the draft is not kept, or None -----------------------------------


def _failure(chunks: Sequence[Chunk]) -> str | None:
    for chunk in chunks:
        if chunk.error is not None:
            return _cut(f"the draft failed: {chunk.error.message}")
    if not chunks or not chunks[-1].is_last:
        return "the draft failed: its answer ended before its last chunk"
    return None


def _unfinished(chunks: Sequence[Chunk], length_is_normal: bool) -> str | None:
    finishes = _finishes(chunks)
    normal = NORMAL_FINISHES | {"length"} if length_is_normal else NORMAL_FINISHES
    for index, finish in finishes.items():
        if finish is None:
            return f"{_choice(index, finishes)}did not finish"
        if finish not in normal:
            return f"{_choice(index, finishes)}finished by {finish}"
    return None


def _unstructured(chunks: Sequence[Chunk], structure: Structure | None) -> str | None:
    if structure is None or not (structure.json_object or structure.json_schema is not None):
        return None
    validator = None
    if structure.json_schema is not None:
        validator, problem = _validator(structure.json_schema)
        if validator is None:
            return problem
    texts = _texts(chunks)
    for index, text in texts.items():
        where = _choice(index, texts)
        try:
            document = json.loads(text, parse_constant=_not_json)
        except ValueError as exc:
            return _cut(f"{where}not valid JSON: {exc}")
        except RecursionError:
            return f"{where}not valid JSON: nested too deeply to read"
        if structure.json_object and not isinstance(document, dict):
            return f"{where}not a JSON object"
        mismatch = _mismatch(validator, document) if validator is not None else None
        if mismatch is not None:
            return _cut(where + mismatch)
    return None


def _unconfident(mean: float | None, min_mean_logprob: float) -> str | None:
    if mean is None:
        return "the draft carried no log-probabilities"
    if mean < min_mean_logprob:
        return f"mean token log-probability {mean:.2f} below {min_mean_logprob:.2f}"
    return None


# --- helpers ----------------------------------------------------------------------------------------


def _finishes(chunks: Iterable[Chunk]) -> dict[int, str | None]:
    """Each choice's finish reason (None: it never finished), by index."""
    finishes: dict[int, str | None] = {}
    for chunk in chunks:
        if chunk.error is None:
            finishes.setdefault(chunk.index, None)
            if chunk.finish_reason is not None:
                finishes[chunk.index] = chunk.finish_reason
    return dict(sorted(finishes.items()))


def _texts(chunks: Iterable[Chunk]) -> dict[int, str]:
    """Each choice's whole text, by index."""
    parts: dict[int, list[str]] = {}
    for chunk in chunks:
        parts.setdefault(chunk.index, []).append(chunk.text)
    return {index: "".join(parts[index]) for index in sorted(parts)}


def _choice(index: int, choices: dict[int, Any]) -> str:
    """How a reason names the choice at fault: by its index, when there are several."""
    return f"choice {index} " if len(choices) > 1 else ""


def _validator(schema_text: str) -> tuple[Validator | None, str | None]:
    """A validator for the client's schema, of the class its `$schema` names (the newest draft if
    none, or one unknown), or None and why the schema itself is not one."""
    try:
        schema = json.loads(schema_text)
        with warnings.catch_warnings(action="ignore", category=DeprecationWarning):  # an unknown `$schema`
            cls = validators.validator_for(schema)
        cls.check_schema(schema)
    except SchemaError as exc:
        return None, _cut(f"the requested schema is not a valid JSON Schema: {exc.message}")
    except (ValueError, RecursionError) as exc:
        return None, _cut(f"the requested schema cannot be read: {exc}")
    # No format checker: formats ("email", "date") are annotations by default in JSON Schema, and
    # the engine's grammar does not hold the model to them either.
    return cls(schema), None


def _mismatch(validator: Validator, document: Any) -> str | None:
    """Why the schema refuses `document` (its most telling error), or None."""
    try:
        # A looping schema recurses to Python's limit; a garbage collection that ran down there
        # would run other objects' finalizers with no stack left, and they would fail.
        with _no_collection():
            error = best_match(validator.iter_errors(document))
    except Unresolvable as exc:  # a `$ref` to a schema that is not in it: nothing is fetched
        return f"the requested schema cannot be applied: {exc}"
    except RecursionError:  # a `$ref` that leads back to itself with nothing in between
        return "the requested schema cannot be applied: its references loop"
    if error is None:
        return None
    return f"does not match the schema: {error.json_path}: {error.message}"


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection in this block (a collection already paused stays paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _cut(reason: str) -> str:
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"
