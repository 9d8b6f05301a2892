"""A router model's choice between described targets, for a pipeline of the `router` shape.

A small model reads the targets' descriptions and the request's text (`switchboard.config.pipelines`
holds the prompt) and answers with one label, its output constrained to the labels (`choice`). Its
answer's log-probabilities weigh every label, not only the one it said, so that a warm target close
to the best can win over a cold one: a cold start costs seconds, a near tie costs nothing.

Scoring needs no tokenizer (the front door has none). A label's log-score is that of the path toward
it: the generated tokens it shares with the answer, then the best alternative, at the position where
the answer leaves it, that continues it. The scores are then normalised over the labels.

What vLLM's log-probabilities hold under a `choice` constraint (vLLM 0.32, the default
`logprobs_mode = "raw_logprobs"`): the grammar's bitmask is applied to the logits before the sampler
computes them, so tokens outside the grammar come back at -inf (the workers send -9999 for it) and
the labels' first tokens are the finite ones; "raw" means before the logit processors, so the
router's `logit_bias` steers its answer but does not show in the scores. An engine that took the
log-probabilities before the mask would show tokens outside the grammar as well; they continue no
label and are passed over, so both cases score the same labels. Because a bias steers the answer
and not the scores, the router's best is the label it answered; the scores only weigh how close the
others came.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from router.openai.errors import OpenAIError
from switchboard.config import RouterModelConfig
from switchboard.wire import ChatMessage, Chunk, SamplingParams, StructuredOutput, TokenLogprob, Usage

# Runs the router's job and yields its chunks (raises if it cannot run it); closed early, it stops
# the router's generation: a label is known as soon as its text leaves every other label.
AskRouter = Callable[[tuple[ChatMessage, ...], SamplingParams], AsyncGenerator[Chunk, None]]
ChosenBy = Literal["router", "warm", "default"]

# vLLM refuses more alternatives than its `max_logprobs` (20 by default).
MOST_ALTERNATIVES = 20


@dataclass(frozen=True, slots=True)
class RouterChoice:
    """The target a router pipeline sends a request to, and how it was chosen."""

    label: str
    # The model, route or pipeline that answers (the label's target).
    target: str
    # "router": the router's best; "warm": a warm target close to a cold best; "default": the
    # router failed, was too slow or answered no label.
    chosen_by: ChosenBy
    # Why the default was taken ("timeout after 2 s", ...); None otherwise.
    reason: str | None = None
    # Label -> its share of the router's belief (summing to 1); empty when nothing was read.
    scores: dict[str, float] = field(default_factory=dict)
    # The router job's usage, when it answered.
    usage: Usage | None = None


def request_text(messages: Sequence[ChatMessage] | None, prompt: str | None, limit: int) -> str:
    """What the router reads of a request: its last user message (a chat with none: its last
    message with text) or its prompt, cut to its last `limit` characters (a question tends to end
    a long message)."""
    text = prompt or ""
    if messages:
        said = [message.content for message in messages if message.content]
        asked = [message.content for message in messages if message.content and message.role == "user"]
        text = (asked or said or [""])[-1]
    return text[-limit:] if len(text) > limit else text


def router_messages(config: RouterModelConfig, text: str) -> tuple[ChatMessage, ...]:
    """The router's conversation: one user message, the configured prompt with the targets and the
    request filled in (as values: braces in them are text)."""
    targets = "\n".join(f"- {label}: {target.description}" for label, target in config.targets.items())
    return (ChatMessage(role="user", content=config.prompt.format(targets=targets, request=text)),)


def router_sampling(config: RouterModelConfig) -> SamplingParams:
    """Greedy, one label long, with enough alternatives per position to see every label's start."""
    labels = tuple(config.targets)
    # Every token holds at least one byte of the label; one more token for the end of the answer.
    longest = max(len(label.encode()) for label in labels) + 1
    bias = {int(token): value for token, value in (config.logit_bias or {}).items()}
    return SamplingParams(
        max_tokens=longest,
        temperature=0.0,
        logprobs=min(MOST_ALTERNATIVES, max(5, 2 * len(labels))),
        logit_bias=bias or None,
        structured=StructuredOutput(choice=labels),
    )


def label_scores(labels: Sequence[str], chunks: Sequence[Chunk]) -> tuple[str | None, dict[str, float]]:
    """The label the router answered (None if its text is no label) and each label's share of the
    router's belief (empty when the answer carried no log-probabilities; 0 for a label not seen)."""
    first = [chunk for chunk in chunks if chunk.index == 0]
    ended = any(chunk.finish_reason is not None for chunk in first)
    answered = _label_of(labels, "".join(chunk.text for chunk in first), ended=ended)
    tokens = [token for chunk in chunks if chunk.index == 0 for token in chunk.logprobs]
    if not tokens:
        return answered, {}
    log_scores = {label: _log_score(label, answered, tokens) for label in labels}
    return answered, _normalised(log_scores)


def pick(
    config: RouterModelConfig,
    answered: str | None,
    scores: Mapping[str, float],
    is_warm: Callable[[str], bool],
) -> RouterChoice:
    """The router's best label (the one it answered, else the one it believed most), or a warm
    target within `warm_margin` of it when its own target is cold, or the default."""
    best = answered if answered is not None else _most_believed(scores)
    if best is None:
        return default_choice(config, "no label read")
    target = config.targets[best].model
    kept = dict(scores)
    if is_warm(target):
        return RouterChoice(best, target, "router", scores=kept)
    warm = _closest_warm(config, best, scores, is_warm)
    if warm is not None:
        return RouterChoice(warm, config.targets[warm].model, "warm", scores=kept)
    return RouterChoice(best, target, "router", scores=kept)


def default_choice(config: RouterModelConfig, reason: str) -> RouterChoice:
    """The default target, taken for `reason`."""
    return RouterChoice(config.default, config.targets[config.default].model, "default", reason, {})


async def choose(
    config: RouterModelConfig, text: str, ask: AskRouter, is_warm: Callable[[str], bool]
) -> RouterChoice:
    """Ask the router which target answers `text`, within `config.timeout_s`. A router that fails,
    is too slow or answers no label leaves the choice to the default; this never raises for it.

    The router's answer is read only until it names one label: the tokens that would finish the
    label (and the end of the answer) would cost time and tell nothing more."""
    labels = tuple(config.targets)
    chunks: list[Chunk] = []
    try:
        async with asyncio.timeout(config.timeout_s):
            answer = ask(router_messages(config, text), router_sampling(config))
            try:
                async for chunk in answer:
                    chunks.append(chunk)
                    if chunk.error is not None or decided(labels, chunks):
                        break
            finally:
                await answer.aclose()
    except TimeoutError:
        return default_choice(config, f"timeout after {config.timeout_s:g} s")
    except Exception as error:  # whatever failed the router, the default answers
        return default_choice(config, f"the router failed: {_described(error)}")
    failed = next((chunk.error for chunk in chunks if chunk.error is not None), None)
    if failed is not None:
        return default_choice(config, f"the router failed: {failed.code}: {failed.message}")
    usage = next((chunk.usage for chunk in reversed(chunks) if chunk.usage is not None), None)
    answered, scores = label_scores(labels, chunks)
    return replace(pick(config, answered, scores, is_warm), usage=usage)


def decided(labels: Sequence[str], chunks: Sequence[Chunk]) -> bool:
    """Whether the router's answer so far names one label: its text begins one label only (a label
    that begins another, "code" and "codes", is named only once the answer ends)."""
    text = "".join(chunk.text for chunk in chunks if chunk.index == 0).strip()
    return bool(text) and sum(label.startswith(text) for label in labels) == 1


def _label_of(labels: Sequence[str], text: str, *, ended: bool) -> str | None:
    """The label the router's text names: itself, or, for an answer read only until it was decided
    (not `ended`), the only label it begins; None if it names none."""
    text = text.strip()
    if text in labels or ended:
        return text if text in labels else None
    begun = [label for label in labels if text and label.startswith(text)]
    return begun[0] if len(begun) == 1 else None


def _log_score(label: str, answered: str | None, tokens: Sequence[TokenLogprob]) -> float:
    """The log-probability of the path toward `label`: the whole answer for the label answered;
    for another, the tokens it shares with the answer and the best alternative that continues it
    where the answer leaves it (-inf when no alternative there continues it)."""
    if label == answered:
        return sum(token.logprob or 0.0 for token in tokens)
    shared, before = "", 0.0
    for token in tokens:
        if token.token and label.startswith(shared + token.token):
            shared += token.token
            before += token.logprob or 0.0
            continue
        remaining = label[len(shared) :]
        continuing = [
            top.logprob
            for top in token.top
            if top.token and top.token != token.token and _continues(top.token, remaining)
        ]
        return before + max(continuing) if continuing else -math.inf
    return -math.inf


def _continues(piece: str, remaining: str) -> bool:
    """Whether a token's text leads on toward a label whose `remaining` text is still to come."""
    return remaining.startswith(piece) or piece.startswith(remaining)


def _normalised(log_scores: Mapping[str, float]) -> dict[str, float]:
    """Each label's share (a softmax over the log-scores); labels never seen get 0."""
    seen = [value for value in log_scores.values() if value > -math.inf]
    if not seen:
        return {label: 0.0 for label in log_scores}
    top = max(seen)
    weights = {label: math.exp(value - top) for label, value in log_scores.items()}
    total = sum(weights.values())
    return {label: weight / total for label, weight in weights.items()}


def _most_believed(scores: Mapping[str, float]) -> str | None:
    best = max(scores, key=lambda label: scores[label], default=None)
    return best if best is not None and scores[best] > 0 else None


def _closest_warm(
    config: RouterModelConfig, best: str, scores: Mapping[str, float], is_warm: Callable[[str], bool]
) -> str | None:
    """The warm label the router believed most among those within `warm_margin` of `best` (and
    considered at all); None when there is none, or no margin."""
    if config.warm_margin <= 0 or not scores:
        return None
    floor = scores.get(best, 0.0) - config.warm_margin
    close = [
        label
        for label, share in scores.items()
        if label != best and share > 0 and share >= floor and is_warm(config.targets[label].model)
    ]
    return max(close, key=lambda label: scores[label], default=None)


def _described(error: Exception) -> str:
    if isinstance(error, OpenAIError):
        return error.message
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
