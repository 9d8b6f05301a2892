"""The router model's choice (`router.routing.pipelines.router_model`): what it reads, how it is asked, how its
answer's log-probabilities weigh the labels, the warm target that wins over a cold best, and the
default taken when the router fails, is too slow or answers no label."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Callable

import pytest

from router.openai.errors import ModelLoadFailedError
from router.routing.pipelines.router_model import (
    choose,
    decided,
    label_scores,
    pick,
    request_text,
    router_messages,
    router_sampling,
)
from switchboard.config import RouterTarget
from switchboard.config.pipelines import DEFAULT_ROUTER_PROMPT, RouterModelConfig
from switchboard.wire import ChatMessage, Chunk, JobError, SamplingParams, TokenLogprob, TopLogprob, Usage

# What the workers send for a token the grammar masked (-inf has no JSON).
MASKED = -9999.0
EOS = "</s>"


def config(*labels: str, default: str | None = None, **fields: object) -> RouterModelConfig:
    targets = {label: RouterTarget(model=f"{label}-model", description=f"{label} things") for label in labels}
    return RouterModelConfig(model="router", targets=targets, default=default or labels[0], **fields)  # type: ignore[arg-type]


def token(text: str, logprob: float, **top: float) -> TokenLogprob:
    """A generated token and its alternatives (the token itself among them, as vLLM ranks it)."""
    alternatives = {text: logprob, **top}
    ranked = sorted(alternatives.items(), key=lambda item: -item[1])
    return TokenLogprob(token=text, logprob=logprob, top=tuple(TopLogprob(t, lp) for t, lp in ranked))


def answer(*tokens: TokenLogprob, usage: Usage | None = None) -> list[Chunk]:
    """The router's chunks: its tokens' text (the end-of-sequence token has none) and log-probs."""
    text = "".join(t.token for t in tokens if t.token != EOS)
    usage = usage or Usage(prompt_tokens=30, completion_tokens=len(tokens))
    # As a worker writes a job's end: the last chunk carries the finish reason and the usage.
    return [Chunk(text=text, logprobs=tokens, finish_reason="stop", usage=usage)]


def softmax(*log_scores: float) -> list[float]:
    total = sum(math.exp(value) for value in log_scores)
    return [math.exp(value) / total for value in log_scores]


def end(logprob: float = 0.0, **top: float) -> TokenLogprob:
    return token(EOS, logprob, **top)


def warm(*models: str) -> Callable[[str], bool]:
    """The caller's view of which targets are warm."""
    return lambda model: model in models


# --- scoring -------------------------------------------------------------------------------------


def test_single_token_labels_share_the_first_position() -> None:
    chunks = answer(token("math", -0.2, code=-1.9, chat=-3.0, the=MASKED), end())

    answered, scores = label_scores(["math", "code", "chat"], chunks)

    assert answered == "math"
    assert list(scores.values()) == pytest.approx(softmax(-0.2, -1.9, -3.0))
    assert list(scores) == ["math", "code", "chat"]


def test_labels_sharing_a_prefix_part_where_the_answer_leaves_them() -> None:
    # "coding" answered as "cod" + "ing"; "code" leaves it at the second token ("e"), "chat" at the
    # first, where "chat" itself and "c" both continue it (the better counts).
    chunks = answer(token("cod", -0.1, chat=-2.5, c=-4.0), token("ing", -0.5, e=-1.0), end())

    answered, scores = label_scores(["code", "coding", "chat"], chunks)

    assert answered == "coding"
    assert [scores["code"], scores["coding"], scores["chat"]] == pytest.approx(
        softmax(-0.1 - 1.0, -0.1 - 0.5, -2.5)
    )


def test_a_label_that_the_answer_completes_is_continued_where_the_answer_ends() -> None:
    # "code" answered; "codes" goes on with "s" where the answer ended.
    chunks = answer(token("code", -0.3), end(-0.4, s=-1.4))

    answered, scores = label_scores(["code", "codes"], chunks)

    assert answered == "code"
    assert [scores["code"], scores["codes"]] == pytest.approx(softmax(-0.3 - 0.4, -0.3 - 1.4))


def test_a_label_absent_from_the_alternatives_gets_no_share() -> None:
    chunks = answer(token("math", -0.1, code=-2.0), end())

    _, scores = label_scores(["math", "code", "poetry"], chunks)

    assert scores["poetry"] == 0.0
    assert scores["math"] + scores["code"] == pytest.approx(1.0)


def test_alternatives_outside_the_grammar_are_passed_over() -> None:
    # Log-probabilities taken before the grammar's mask hold tokens no label starts with.
    raw = answer(token("math", -2.0, The=-0.5, Hello=-1.0, code=-3.0), end(-0.1, **{".": -0.5}))
    masked = answer(token("math", -0.3, code=-1.3, The=MASKED, Hello=MASKED), end())

    _, raw_scores = label_scores(["math", "code"], raw)
    _, masked_scores = label_scores(["math", "code"], masked)

    assert [raw_scores["math"], raw_scores["code"]] == pytest.approx(softmax(-2.1, -3.0))
    assert [masked_scores["math"], masked_scores["code"]] == pytest.approx(softmax(-0.3, -1.3))


def test_an_answer_that_is_no_label_is_not_read_as_one() -> None:
    answered, scores = label_scores(["math", "code"], answer(token("mat", -0.1, code=-2.0)))

    assert answered is None
    assert scores["code"] == pytest.approx(1.0)  # the only label the answer's path shows


def test_an_answer_without_log_probabilities_names_its_label_and_no_shares() -> None:
    chunks = [
        Chunk(text=" code\n", finish_reason="stop"),
        Chunk(usage=Usage(prompt_tokens=3, completion_tokens=2)),
    ]

    assert label_scores(["math", "code"], chunks) == ("code", {})


def test_the_demo_models_answer_as_vllm_gives_it_under_a_choice_and_a_bias() -> None:
    # Recorded from vLLM 0.32's CPU engine on the demo model (labels math, code, coding, chat; a
    # +30 bias on "ch"). The grammar's mask comes before the log-probabilities (tokens outside it
    # at -9999, the end token certain); the bias comes after them: "ch" was taken at -1.18 while
    # "c" stood at -0.39, so the router's unbiased belief still favours "code" and "coding".
    chunks = answer(
        token("ch", -1.184, c=-0.394, m=-3.929, ance=MASKED, mode=MASKED),
        token("at", -0.0002, a=-8.646, ant=MASKED),
        end(0.0, ance=MASKED, orning=MASKED),
    )
    labels = ["math", "code", "coding", "chat"]

    answered, scores = label_scores(labels, chunks)

    assert answered == "chat"
    # "c" starts both "code" and "coding": the path toward each is as likely as far as it is seen.
    assert [scores[label] for label in labels] == pytest.approx(softmax(-3.929, -0.394, -0.394, -1.1842))
    routed = config(*labels, warm_margin=0.1)
    assert pick(routed, answered, scores, warm(*(f"{label}-model" for label in labels))).label == "chat"
    assert pick(routed, answered, scores, warm("code-model")).chosen_by == "warm"


# --- picking -------------------------------------------------------------------------------------


def test_the_answered_label_wins_when_its_target_is_warm() -> None:
    routed = config("math", "code")

    choice = pick(routed, "code", {"math": 0.45, "code": 0.55}, warm("math-model", "code-model"))

    assert (choice.label, choice.target, choice.chosen_by, choice.reason) == (
        "code",
        "code-model",
        "router",
        None,
    )
    assert choice.scores == {"math": 0.45, "code": 0.55}


def test_a_warm_target_within_the_margin_wins_over_a_cold_best() -> None:
    routed = config("math", "code", "chat", warm_margin=0.2)

    choice = pick(routed, "code", {"math": 0.3, "code": 0.45, "chat": 0.25}, warm("math-model", "chat-model"))

    assert (choice.label, choice.target, choice.chosen_by) == ("math", "math-model", "warm")


def test_a_warm_target_outside_the_margin_leaves_the_cold_best() -> None:
    routed = config("math", "code", warm_margin=0.1)

    choice = pick(routed, "code", {"math": 0.3, "code": 0.7}, warm("math-model"))

    assert (choice.label, choice.target, choice.chosen_by) == ("code", "code-model", "router")


def test_no_margin_never_trades_the_best_for_a_warm_one() -> None:
    routed = config("math", "code", warm_margin=0.0)

    assert pick(routed, "code", {"math": 0.5, "code": 0.5}, warm("math-model")).label == "code"


def test_a_warm_target_the_router_never_considered_does_not_win() -> None:
    routed = config("math", "code", "chat", warm_margin=1.0)

    choice = pick(routed, "code", {"math": 0.0, "code": 1.0, "chat": 0.0}, warm("math-model", "chat-model"))

    assert choice.label == "code"


def test_without_an_answered_label_the_most_believed_wins_and_without_either_the_default() -> None:
    routed = config("math", "code", default="math")

    assert pick(routed, None, {"math": 0.2, "code": 0.8}, warm("code-model")).label == "code"
    choice = pick(routed, None, {}, warm("code-model"))
    assert (choice.label, choice.chosen_by, choice.reason, choice.scores) == (
        "math",
        "default",
        "no label read",
        {},
    )


# --- asking --------------------------------------------------------------------------------------


async def test_the_router_is_asked_once_and_its_choice_carries_its_usage() -> None:
    routed = config("math", "code")
    asked: list[tuple[tuple[ChatMessage, ...], SamplingParams]] = []
    usage = Usage(prompt_tokens=41, completion_tokens=2)

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        asked.append((messages, sampling))
        for chunk in answer(token("code", -0.1, math=-2.4), end(), usage=usage):
            yield chunk

    choice = await choose(routed, "fix my loop", ask, warm("math-model", "code-model"))

    assert (choice.label, choice.chosen_by, choice.usage) == ("code", "router", usage)
    assert asked == [(router_messages(routed, "fix my loop"), router_sampling(routed))]


async def test_a_router_slower_than_its_timeout_leaves_the_choice_to_the_default() -> None:
    routed = config("math", "code", default="math", timeout_s=0.05)

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        await asyncio.sleep(5)
        raise AssertionError("not reached")
        yield Chunk()

    choice = await choose(routed, "hi", ask, warm())

    assert (choice.label, choice.target, choice.chosen_by) == ("math", "math-model", "default")
    assert choice.reason == "timeout after 0.05 s"
    assert (choice.scores, choice.usage) == ({}, None)


LOAD_FAILED = ModelLoadFailedError("router", "out of memory", 5.0)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (LOAD_FAILED, f"the router failed: {LOAD_FAILED.message}"),
        (ConnectionError("redis went away"), "the router failed: ConnectionError: redis went away"),
    ],
)
async def test_a_router_that_fails_leaves_the_choice_to_the_default(failure: Exception, reason: str) -> None:
    routed = config("math", "code", default="code")

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        raise failure
        yield Chunk()

    choice = await choose(routed, "hi", ask, warm())

    assert (choice.label, choice.chosen_by, choice.reason) == ("code", "default", reason)


async def test_a_router_job_that_ends_in_an_error_leaves_the_choice_to_the_default() -> None:
    routed = config("math", "code")

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        yield Chunk(error=JobError(code="engine_error", message="the engine died"))

    choice = await choose(routed, "hi", ask, warm())

    assert (choice.chosen_by, choice.reason) == (
        "default",
        "the router failed: engine_error: the engine died",
    )


async def test_a_router_answering_no_label_leaves_the_choice_to_the_default_with_its_usage() -> None:
    routed = config("math", "code")

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        yield Chunk(text="banana", finish_reason="length")
        yield Chunk(usage=Usage(prompt_tokens=9, completion_tokens=6))

    choice = await choose(routed, "hi", ask, warm())

    assert (choice.chosen_by, choice.reason) == ("default", "no label read")
    assert choice.usage == Usage(prompt_tokens=9, completion_tokens=6)


# --- what the router reads, and how it is asked --------------------------------------------------


def test_the_router_reads_the_last_user_message_keeping_its_end() -> None:
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="first question"),
        ChatMessage(role="assistant", content="an answer"),
        ChatMessage(role="user", content="0123456789"),
        ChatMessage(role="assistant", content=None),
    ]

    assert request_text(messages, None, 4) == "6789"
    assert request_text(messages, None, 100) == "0123456789"
    assert request_text([ChatMessage(role="system", content="only a system")], None, 100) == "only a system"


def test_the_router_reads_a_completion_prompt_keeping_its_end() -> None:
    assert request_text(None, "a long prompt", 6) == "prompt"
    assert request_text(None, None, 6) == ""


def test_the_prompt_lists_the_targets_in_order_and_keeps_braces_of_descriptions_and_requests() -> None:
    routed = RouterModelConfig(
        model="router",
        targets={
            "json": RouterTarget(model="m1", description='emits {"a": 1} objects'),
            "math": RouterTarget(model="m2", description="proofs with {x | x > 0}"),
        },
        default="math",
    )

    (message,) = router_messages(routed, "format {request} and {0} please }")

    assert message.role == "user"
    assert message.content == DEFAULT_ROUTER_PROMPT.format(
        targets='- json: emits {"a": 1} objects\n- math: proofs with {x | x > 0}',
        request="format {request} and {0} please }",
    )
    assert '- json: emits {"a": 1} objects\n- math: proofs' in message.content
    assert message.content.count("format {request} and {0} please }") == 1


def test_the_router_is_asked_greedily_for_one_label_with_alternatives_and_its_biases() -> None:
    routed = config("math", "coding", logit_bias={"17": 5.0, "3": -100.0})

    sampling = router_sampling(routed)

    assert sampling.temperature == 0.0
    assert sampling.structured is not None and sampling.structured.choice == ("math", "coding")
    assert sampling.logprobs == 5
    assert sampling.max_tokens is not None and sampling.max_tokens > len("coding")
    assert sampling.logit_bias == {17: 5.0, 3: -100.0}
    assert router_sampling(config(*(f"label{i}" for i in range(15)))).logprobs == 20
    assert router_sampling(config("a", "b")).logit_bias is None


async def test_the_answer_is_read_only_until_it_names_one_label() -> None:
    routed = config("math", "code")
    read: list[str] = []
    closed = asyncio.Event()

    async def ask(messages: tuple[ChatMessage, ...], sampling: SamplingParams) -> AsyncGenerator[Chunk, None]:
        try:
            for piece, logprob in (("c", -0.2), ("o", -0.01), ("de", -0.01)):
                read.append(piece)
                alternatives = (TopLogprob(piece, logprob), TopLogprob("m", -1.9)) if piece == "c" else ()
                yield Chunk(text=piece, logprobs=(TokenLogprob(piece, logprob, alternatives),))
            yield Chunk(finish_reason="stop", usage=Usage(prompt_tokens=9, completion_tokens=4))
        finally:
            closed.set()

    choice = await choose(routed, "fix my loop", ask, warm("math-model", "code-model"))

    assert (choice.label, choice.chosen_by) == ("code", "router")
    assert read == ["c"], "the first token already left 'math': nothing more was read"
    assert closed.is_set(), "the router's answer was closed (its job stopped)"
    assert choice.usage is None  # told later, by the stopped job's end
    assert choice.scores["code"] > 0.8 and choice.scores["math"] > 0


def test_a_label_that_begins_another_is_named_only_when_the_answer_ends() -> None:
    labels = ("code", "codes")
    assert not decided(labels, [Chunk(text="code")])
    assert decided(labels, [Chunk(text="codes")])
    assert decided(("math", "code"), [Chunk(text="m")])
    assert not decided(("math", "code"), [Chunk(text=" ")])
