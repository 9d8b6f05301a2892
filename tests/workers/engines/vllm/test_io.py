"""workers.engines.vllm.io: our sampling parameters into vLLM's, and vLLM's request outputs into deltas.

vLLM's output objects are stood in for by dataclasses with the attributes the reader uses; the
sampling parameters are built with the real vLLM (imported once, only by the tests that need it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from switchboard.wire import SamplingParams, StructuredOutput, TokenLogprob, TopLogprob
from workers.engines.base import InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt, PromptBuilder
from workers.engines.refusals import MAX_REASON_CHARS
from workers.engines.vllm.io import (
    LOWEST_LOGPROB,
    OutputReader,
    engine_prompt,
    finish_reason,
    greedy_copies,
    refusal_of,
    vllm_sampling_params,
)

VOCAB_SIZE = 100
CONTEXT = 64


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Completion:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None


@dataclass
class Output:
    outputs: list[Completion]
    finished: bool = False
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class Tokenizer:
    """Token `i` is the text `<i>`; the vocabulary's longest entry is 3 characters."""

    decoded: list[list[int]] = field(default_factory=list)

    def decode(self, token_ids: list[int]) -> str:
        self.decoded.append(list(token_ids))
        return "".join(f"<{token}>" for token in token_ids)

    def get_vocab(self) -> dict[str, int]:
        return {f"t{token:02d}": token for token in range(VOCAB_SIZE)}


PROMPT = BuiltPrompt([1, 2, 3], "Say:")


def reader(sampling: SamplingParams, prompt: BuiltPrompt = PROMPT) -> OutputReader:
    return OutputReader(sampling, prompt, Tokenizer())


# --- counts and choices ---------------------------------------------------------------------------


def test_counts_accumulate_and_the_finished_output_ends_the_request() -> None:
    read = reader(SamplingParams(max_tokens=8))
    first = read.deltas(Output([Completion(0, "ab", [10, 11])]))
    second = read.deltas(Output([Completion(0, "c", [12], finish_reason="length")], finished=True))
    assert [
        (d.text, d.index, d.prompt_tokens, d.completion_tokens, d.finish_reason, d.last)
        for d in first + second
    ] == [
        ("ab", 0, 3, 2, None, False),
        ("c", 0, 3, 3, "length", True),
    ]


def test_several_choices_each_keep_their_index() -> None:
    read = reader(SamplingParams(n=2, temperature=0.8))
    deltas = read.deltas(Output([Completion(1, "x", [5]), Completion(0, "y", [6, 7])]))
    assert [(d.index, d.text, d.completion_tokens) for d in deltas] == [(1, "x", 1), (0, "y", 3)]
    deltas = read.deltas(
        Output(
            [Completion(0, "", [], finish_reason="stop"), Completion(1, "z", [8], finish_reason="stop")],
            finished=True,
        )
    )
    assert [(d.index, d.finish_reason, d.last) for d in deltas] == [(0, "stop", False), (1, "stop", True)]
    assert deltas[-1].completion_tokens == 4


def test_a_finished_output_without_choices_still_ends_the_request() -> None:
    read = reader(SamplingParams())
    read.deltas(Output([Completion(0, "ab", [10, 11])]))
    (end,) = read.deltas(Output([], finished=True))
    assert (end.text, end.last, end.prompt_tokens, end.completion_tokens) == ("", True, 3, 2)


def test_an_unfinished_output_without_choices_says_nothing() -> None:
    assert reader(SamplingParams()).deltas(Output([])) == []


def test_greedy_copies_repeat_each_delta() -> None:
    read = reader(SamplingParams(n=3, temperature=0.0))
    deltas = read.deltas(Output([Completion(0, "ab", [10, 11])]))
    assert [(d.index, d.text) for d in deltas] == [(0, "ab"), (1, "ab"), (2, "ab")]
    # Each copy counts as generated: OpenAI bills n choices.
    assert {d.completion_tokens for d in deltas} == {6}
    deltas = read.deltas(Output([Completion(0, "c", [12], finish_reason="stop")], finished=True))
    assert [(d.index, d.finish_reason, d.last) for d in deltas] == [
        (0, "stop", False),
        (1, "stop", False),
        (2, "stop", True),
    ]
    assert deltas[-1].completion_tokens == 9


def test_an_error_finish_raises() -> None:
    with pytest.raises(RuntimeError, match="choice 1"):
        reader(SamplingParams(n=2, temperature=1.0)).deltas(
            Output([Completion(0, "a", [1]), Completion(1, "", [], finish_reason="error")], finished=True)
        )


@pytest.mark.parametrize(
    ("reason", "ours"),
    [(None, None), ("stop", "stop"), ("length", "length"), ("abort", "abort"), ("repetition", "stop")],
)
def test_finish_reason(reason: str | None, ours: str | None) -> None:
    assert finish_reason(reason) == ours


@pytest.mark.parametrize(
    ("temperature", "n", "copies"),
    [(None, 4, 1), (0.0, 4, 4), (1e-6, 4, 4), (1e-5, 4, 1), (0.7, 4, 1), (0.0, 1, 1)],
)
def test_greedy_copies(temperature: float | None, n: int, copies: int) -> None:
    assert greedy_copies(SamplingParams(n=n, temperature=temperature)) == copies


# --- echo -----------------------------------------------------------------------------------------


def test_echo_prefixes_each_choices_first_delta_only() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0, echo=True))
    first = read.deltas(Output([Completion(0, " a", [10])]))
    second = read.deltas(Output([Completion(0, " b", [11]), Completion(1, " c", [12])]))
    third = read.deltas(Output([Completion(1, " d", [13], finish_reason="stop")], finished=True))
    assert [(d.index, d.text) for d in first + second + third] == [
        (0, "Say: a"),
        (0, " b"),
        (1, "Say: c"),
        (1, " d"),
    ]


def test_echo_with_greedy_copies_prefixes_every_copy_once() -> None:
    read = reader(SamplingParams(n=2, temperature=0.0, echo=True))
    first = read.deltas(Output([Completion(0, " a", [10])]))
    second = read.deltas(Output([Completion(0, " b", [11], finish_reason="stop")], finished=True))
    assert [(d.index, d.text) for d in first + second] == [(0, "Say: a"), (1, "Say: a"), (0, " b"), (1, " b")]


def test_echoed_logprobs_come_first_and_the_first_prompt_token_has_none() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0, echo=True, logprobs=1))
    prompt_logprobs: list[dict[int, Logprob] | None] = [
        None,
        {2: Logprob(-0.5, 1, "Sa")},
        {3: Logprob(-2.0, 2, "y:"), 9: Logprob(-0.1, 1, "!")},
    ]
    generated = [{10: Logprob(-0.3, 1, " a")}]
    (first,) = read.deltas(Output([Completion(0, " a", [10], generated)], prompt_logprobs=prompt_logprobs))
    assert first.logprobs == (
        TokenLogprob(token="<1>", logprob=None),
        TokenLogprob(token="Sa", logprob=-0.5, top=(TopLogprob("Sa", -0.5),)),
        TokenLogprob(token="y:", logprob=-2.0, top=(TopLogprob("!", -0.1),)),
        TokenLogprob(token=" a", logprob=-0.3, top=(TopLogprob(" a", -0.3),)),
    )
    # vLLM sends the prompt's log probabilities once; the other choice's echo still has them.
    (other,) = read.deltas(Output([Completion(1, " b", [11], [{11: Logprob(-1.0, 1, " b")}])]))
    assert other.logprobs[:3] == first.logprobs[:3]
    assert other.logprobs[3].token == " b"


def test_echo_without_logprobs_has_none() -> None:
    read = reader(SamplingParams(echo=True))
    (delta,) = read.deltas(Output([Completion(0, " a", [10])], prompt_logprobs=[None, {2: Logprob(-1.0, 1)}]))
    assert delta.logprobs == ()


# --- log probabilities ----------------------------------------------------------------------------


def test_alternatives_are_sorted_by_rank_and_cut_to_top_n() -> None:
    read = reader(SamplingParams(logprobs=2))
    candidates = {
        42: Logprob(-3.0, 7, "x"),  # the sampled token, outside the top 2
        11: Logprob(-0.5, 2, "b"),
        10: Logprob(-0.2, 1, "a"),
        12: Logprob(-0.9, 3, "c"),
    }
    (delta,) = read.deltas(Output([Completion(0, "x", [42], [candidates])]))
    assert delta.logprobs == (
        TokenLogprob(token="x", logprob=-3.0, top=(TopLogprob("a", -0.2), TopLogprob("b", -0.5))),
    )


def test_zero_alternatives() -> None:
    read = reader(SamplingParams(logprobs=0))
    (delta,) = read.deltas(
        Output([Completion(0, "x", [42], [{42: Logprob(-1.0, 1, "x"), 7: Logprob(-2.0, 2, "y")}])])
    )
    assert delta.logprobs == (TokenLogprob(token="x", logprob=-1.0, top=()),)


def test_impossible_tokens_get_the_lowest_logprob() -> None:
    read = reader(SamplingParams(logprobs=2))
    candidates = {5: Logprob(-math.inf, 2, "n"), 6: Logprob(0.0, 1, "m"), 7: Logprob(math.nan, 3, "o")}
    (delta,) = read.deltas(Output([Completion(0, "n", [5], [candidates])]))
    (entry,) = delta.logprobs
    assert entry.logprob == LOWEST_LOGPROB
    assert entry.top == (TopLogprob("m", 0.0), TopLogprob("n", LOWEST_LOGPROB))
    read = reader(SamplingParams(logprobs=3))
    (delta,) = read.deltas(Output([Completion(0, "n", [5], [candidates])]))
    assert delta.logprobs[0].top[2] == TopLogprob("o", LOWEST_LOGPROB)


def test_tokens_without_decoded_text_are_decoded() -> None:
    tokenizer = Tokenizer()
    read = OutputReader(SamplingParams(logprobs=1), PROMPT, tokenizer)
    (delta,) = read.deltas(Output([Completion(0, "?", [8, 9], [{8: Logprob(-1.0, 1)}, {}])]))
    assert delta.logprobs == (
        TokenLogprob(token="<8>", logprob=-1.0, top=(TopLogprob("<8>", -1.0),)),
        TokenLogprob(token="<9>", logprob=None),
    )
    assert [8] in tokenizer.decoded


def test_logprobs_only_when_asked() -> None:
    read = reader(SamplingParams())
    (delta,) = read.deltas(Output([Completion(0, "x", [42], [{42: Logprob(-1.0, 1, "x")}])]))
    assert delta.logprobs == ()


def test_logprobs_repeated_with_greedy_copies() -> None:
    read = reader(SamplingParams(n=2, temperature=0.0, logprobs=1))
    deltas = read.deltas(Output([Completion(0, "x", [42], [{42: Logprob(-1.0, 1, "x")}])]))
    assert deltas[0].logprobs == deltas[1].logprobs == (TokenLogprob("x", -1.0, (TopLogprob("x", -1.0),)),)


# --- vLLM's sampling parameters -------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm() -> Any:
    """vLLM's sampling module (slow to import: once per module, and only for the tests that need it)."""
    return pytest.importorskip("vllm.sampling_params")


@pytest.fixture
def prompts() -> PromptBuilder:
    return PromptBuilder(Tokenizer(), model_name="tiny", max_model_len=CONTEXT, vocab_size=VOCAB_SIZE)


PROMPT_10 = BuiltPrompt(list(range(10)), "ten tokens")


def params(sampling: SamplingParams, prompts: PromptBuilder, prompt: BuiltPrompt = PROMPT_10) -> Any:
    return vllm_sampling_params(sampling, prompt, prompts, prompt_param="prompt")


def test_max_tokens_up_to_the_context(vllm: Any, prompts: PromptBuilder) -> None:
    assert params(SamplingParams(max_tokens=CONTEXT - 10), prompts).max_tokens == CONTEXT - 10
    # None: whatever the context leaves.
    assert params(SamplingParams(), prompts).max_tokens == CONTEXT - 10


@pytest.mark.parametrize("max_tokens", [CONTEXT - 9, CONTEXT, 2**31 - 1])
def test_max_tokens_beyond_the_context(vllm: Any, prompts: PromptBuilder, max_tokens: int) -> None:
    with pytest.raises(InvalidEngineRequest) as caught:
        params(SamplingParams(max_tokens=max_tokens), prompts)
    assert (caught.value.param, caught.value.code) == ("max_tokens", "context_length_exceeded")


@pytest.mark.parametrize("token", [VOCAB_SIZE, -1])
def test_logit_bias_outside_the_vocabulary(vllm: Any, prompts: PromptBuilder, token: int) -> None:
    with pytest.raises(InvalidEngineRequest) as caught:
        params(SamplingParams(logit_bias={3: 1.0, token: 5.0}), prompts)
    assert caught.value.param == "logit_bias"
    assert f"0 to {VOCAB_SIZE - 1}" in str(caught.value)


def test_logit_bias_outside_the_vocabulary_has_the_front_doors_code(
    vllm: Any, prompts: PromptBuilder
) -> None:
    with pytest.raises(InvalidEngineRequest) as caught:
        params(SamplingParams(logit_bias={VOCAB_SIZE: 5.0}), prompts)
    assert caught.value.code == "invalid_value"


def test_logit_bias_inside_the_vocabulary(vllm: Any, prompts: PromptBuilder) -> None:
    assert params(SamplingParams(logit_bias={0: -100.0, VOCAB_SIZE - 1: 100.0}), prompts).logit_bias == {
        0: -100.0,
        VOCAB_SIZE - 1: 100.0,
    }


@pytest.mark.parametrize(("temperature", "n"), [(0.0, 1), (0.7, 3), (None, 3)])
def test_n_at_temperature_zero_is_generated_once(
    vllm: Any, prompts: PromptBuilder, temperature: float | None, n: int
) -> None:
    assert params(SamplingParams(n=3, temperature=temperature), prompts).n == n


def test_fields_reach_vllm(vllm: Any, prompts: PromptBuilder) -> None:
    sampling = SamplingParams(
        max_tokens=5,
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        min_p=0.1,
        seed=7,
        stop=("END", "\n\n"),
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        min_tokens=2,
        logprobs=3,
        echo=True,
    )
    built = params(sampling, prompts)
    assert (built.temperature, built.top_p, built.top_k, built.min_p, built.seed) == (0.5, 0.9, 20, 0.1, 7)
    assert built.stop == ["END", "\n\n"]
    assert (built.presence_penalty, built.frequency_penalty, built.repetition_penalty) == (0.5, -0.5, 1.2)
    assert built.min_tokens == 2
    assert (built.logprobs, built.prompt_logprobs) == (3, 3)
    assert built.output_kind == vllm.RequestOutputKind.DELTA


def test_prompt_logprobs_only_with_echo(vllm: Any, prompts: PromptBuilder) -> None:
    assert params(SamplingParams(logprobs=2), prompts).prompt_logprobs is None


def test_structured_output_reaches_vllm(vllm: Any, prompts: PromptBuilder) -> None:
    built = params(SamplingParams(structured=StructuredOutput(json_schema='{"type": "object"}')), prompts)
    assert built.structured_outputs.json == '{"type": "object"}'
    built = params(SamplingParams(structured=StructuredOutput(choice=("yes", "no"))), prompts)
    assert built.structured_outputs.choice == ["yes", "no"]


def test_what_vllm_refuses_is_the_clients_mistake(vllm: Any, prompts: PromptBuilder) -> None:
    with pytest.raises(InvalidEngineRequest):
        params(SamplingParams(max_tokens=3, min_tokens=10), prompts)


# --- what vLLM's generate raises ----------------------------------------------------------------


def generate_error(cause: BaseException) -> BaseException:
    """What `AsyncLLM.generate` raises for an unexpected exception: an EngineGenerateError from it."""
    from vllm.v1.engine.exceptions import EngineGenerateError

    try:
        raise EngineGenerateError() from cause
    except EngineGenerateError as exc:
        return exc


def test_vllms_validation_errors_are_the_clients(vllm: Any) -> None:
    from vllm.exceptions import VLLMValidationError

    pattern = "(?<=a)" + "b" * 5000
    native = "[17:46:50] /project/cpp/regex_converter.cc:83: Regex parsing error at position 3: Lookbehind"
    refused = refusal_of(
        VLLMValidationError(
            f"Failed to transform regex into a grammar: {native}", parameter="regex", value=pattern
        ),
        before_output=True,
    )
    assert isinstance(refused, InvalidEngineRequest)
    # The reason, without the native library's source path nor the refused value.
    assert str(refused).endswith("Regex parsing error at position 3: Lookbehind"), str(refused)
    assert "/project" not in str(refused) and pattern not in str(refused)
    assert (refused.param, refused.code) == ("regex", "invalid_value")
    # vLLM's checks raise ValueError too, which generate wraps: the client's, before any output.
    nul = generate_error(ValueError("structured_outputs.regex must not contain a NUL character"))
    assert isinstance(refusal_of(nul, before_output=True), InvalidEngineRequest)
    path = refusal_of(
        generate_error(ValueError("cannot read /opt/models/x/tokenizer.json")), before_output=True
    )
    assert path is not None and str(path).endswith("cannot read <path>"), str(path)
    long_reason = refusal_of(generate_error(ValueError("x" * 10_000)), before_output=True)
    assert long_reason is not None and len(str(long_reason)) < MAX_REASON_CHARS + 100


def test_the_engines_own_failures_stay_its_own(vllm: Any) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    assert refusal_of(generate_error(ValueError("bad shape")), before_output=False) is None
    assert refusal_of(generate_error(RuntimeError("CUDA error")), before_output=True) is None
    assert refusal_of(EngineDeadError(), before_output=True) is None
    assert refusal_of(RuntimeError("boom"), before_output=True) is None


def test_the_engine_prompt_carries_the_jobs_cache_salt() -> None:
    pytest.importorskip("vllm")
    prompt = BuiltPrompt([5, 6, 7], "abc")
    assert engine_prompt(prompt, "0123abcd:s1") == {
        "prompt_token_ids": [5, 6, 7],
        "cache_salt": "0123abcd:s1",
    }
    assert engine_prompt(prompt, None) == {"prompt_token_ids": [5, 6, 7]}  # the shared cache
