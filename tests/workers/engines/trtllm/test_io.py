"""workers.engines.trtllm.io: our sampling parameters into TensorRT-LLM's, and its outputs into deltas.

No TensorRT-LLM here: the sampling parameters are plain keyword arguments, and TensorRT-LLM's
RequestOutput and CompletionOutput are stood in for by dataclasses with the attributes the reader
uses. The outputs below follow `executor/result.py`: one object mutated on every response, text
and token ids that only grow (but for a stop string's cut), finish reasons set at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from switchboard.context_length import CONTEXT_LENGTH_EXCEEDED
from switchboard.wire import SamplingParams, StructuredOutput, TokenLogprob, TopLogprob
from workers.engines.base import Delta, InvalidEngineRequest
from workers.engines.prompts import BuiltPrompt, PromptBuilder
from workers.engines.refusals import MAX_REASON_CHARS
from workers.engines.sampling import LOWEST_LOGPROB
from workers.engines.trtllm.io import (
    TrtOutputReader,
    choice_regex,
    finish_reason,
    trtllm_sampling,
)
from workers.engines.trtllm.refusals import stream_refusal, submit_refusal

VOCAB_SIZE = 100
CONTEXT = 64


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class Completion:
    """CompletionOutput: the diffs are there, and stale, as in TensorRT-LLM; the reader must not use them."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    _last_token_ids_len: int = 0

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    def grow(self, text: str, *tokens: int) -> None:
        self._last_token_ids_len = len(self.token_ids)
        self.text += text
        self.token_ids += tokens


@dataclass
class Output:
    outputs: list[Completion]
    finished: bool = False


class Tokenizer:
    """Token `i` is the text `<i>`; the vocabulary's longest entry is 3 characters."""

    def decode(self, token_ids: list[int]) -> str:
        return "".join(f"<{token}>" for token in token_ids)

    def get_vocab(self) -> dict[str, int]:
        return {f"t{token:02d}": token for token in range(VOCAB_SIZE)}


PROMPT = BuiltPrompt([1, 2, 3], "Say:")
BUILDER = PromptBuilder(Tokenizer(), model_name="toy", max_model_len=CONTEXT, vocab_size=VOCAB_SIZE)


def sampling_kwargs(sampling: SamplingParams, prompt: BuiltPrompt = PROMPT) -> dict[str, Any]:
    return trtllm_sampling(sampling, prompt, BUILDER, prompt_param="prompt", draw_seed=lambda bits: 77).kwargs


def reader(sampling: SamplingParams, prompt: BuiltPrompt = PROMPT, max_tokens: int = 8) -> TrtOutputReader:
    return TrtOutputReader(sampling, prompt, Tokenizer(), max_tokens=max_tokens)


def rows(deltas: list[Delta]) -> list[tuple[int, str, int, str | None, bool]]:
    return [(d.index, d.text, d.completion_tokens, d.finish_reason, d.last) for d in deltas]


# --- the mapping table (TRTLLM.md §4) --------------------------------------------------------------


def test_max_tokens_is_always_set_and_fills_the_context_when_unset() -> None:
    assert sampling_kwargs(SamplingParams(max_tokens=5))["max_tokens"] == 5
    # TensorRT-LLM's own default would be 32.
    assert sampling_kwargs(SamplingParams())["max_tokens"] == CONTEXT - len(PROMPT.token_ids)


def test_openai_defaults_are_written_out_so_that_sampling_is_not_greedy() -> None:
    kwargs = sampling_kwargs(SamplingParams())
    assert (kwargs["temperature"], kwargs["top_p"]) == (1.0, 1.0)
    assert "top_k" not in kwargs and "min_p" not in kwargs


def test_a_temperature_below_the_threshold_is_greedy_as_top_k_1() -> None:
    kwargs = sampling_kwargs(SamplingParams(temperature=1e-6, top_p=0.5, top_k=40))
    assert kwargs["top_k"] == 1
    assert "temperature" not in kwargs and "top_p" not in kwargs


@pytest.mark.parametrize(("top_k", "sent"), [(None, None), (0, None), (-1, None), (40, 40)])
def test_top_k_of_zero_or_minus_one_means_every_token(top_k: int | None, sent: int | None) -> None:
    assert sampling_kwargs(SamplingParams(top_k=top_k, temperature=0.7)).get("top_k") == sent


def test_sampling_knobs_pass_through() -> None:
    kwargs = sampling_kwargs(
        SamplingParams(
            temperature=0.7,
            top_p=0.9,
            min_p=0.05,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.1,
            min_tokens=3,
            stop=("END", "\n\n"),
        )
    )
    assert kwargs | {"seed": None} == kwargs | {
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
        "min_tokens": 3,
        "stop": ["END", "\n\n"],
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
        "n": 1,
        "seed": None,
    }


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_a_top_p_outside_its_range_is_refused(top_p: float) -> None:
    with pytest.raises(InvalidEngineRequest) as refused:
        sampling_kwargs(SamplingParams(top_p=top_p))
    assert (refused.value.param, refused.value.code) == ("top_p", "invalid_value")


def test_an_unseeded_request_draws_a_seed_and_a_seeded_one_keeps_it() -> None:
    # TensorRT-LLM's unset seed is a fixed 0: identical unseeded requests would sample alike.
    assert sampling_kwargs(SamplingParams())["seed"] == 77
    seeds = {
        trtllm_sampling(SamplingParams(), PROMPT, BUILDER, prompt_param="prompt").kwargs["seed"]
        for _ in range(5)
    }
    assert len(seeds) == 5 and all(0 <= seed < 2**63 for seed in seeds)
    assert sampling_kwargs(SamplingParams(seed=11))["seed"] == 11
    assert sampling_kwargs(SamplingParams(seed=-1))["seed"] == 2**64 - 1


def test_greedy_choices_are_generated_once() -> None:
    assert sampling_kwargs(SamplingParams(n=3, temperature=0.0))["n"] == 1
    assert sampling_kwargs(SamplingParams(n=3, temperature=0.8))["n"] == 3


def test_logprobs_ask_for_at_least_one_and_echo_asks_for_the_prompts_too() -> None:
    assert "logprobs" not in sampling_kwargs(SamplingParams())
    assert sampling_kwargs(SamplingParams(logprobs=0))["logprobs"] == 1
    kwargs = sampling_kwargs(SamplingParams(logprobs=3, echo=True))
    assert (kwargs["logprobs"], kwargs["prompt_logprobs"]) == (3, 3)
    assert "prompt_logprobs" not in sampling_kwargs(SamplingParams(echo=True))


def test_logit_bias_travels_apart_for_the_embedding_bias_vector() -> None:
    sampling = trtllm_sampling(SamplingParams(logit_bias={5: -100.0}), PROMPT, BUILDER, prompt_param="prompt")
    assert sampling.logit_bias == {5: -100.0}
    assert "logit_bias" not in sampling.kwargs and "embedding_bias" not in sampling.kwargs
    with pytest.raises(InvalidEngineRequest) as refused:
        trtllm_sampling(SamplingParams(logit_bias={VOCAB_SIZE: 1.0}), PROMPT, BUILDER, prompt_param="prompt")
    assert refused.value.param == "logit_bias"


@pytest.mark.parametrize(
    ("structured", "guide"),
    [
        (StructuredOutput(json_schema='{"type": "object"}'), {"json": '{"type": "object"}'}),
        (StructuredOutput(json_object=True), {"json_object": True}),
        (StructuredOutput(regex="[0-9]+"), {"regex": "[0-9]+"}),
        (StructuredOutput(choice=("yes", "no")), {"regex": "(yes|no)"}),
        (StructuredOutput(grammar="root ::= 'a'"), {"grammar": "root ::= 'a'"}),
    ],
)
def test_each_structured_output_is_one_guide(structured: StructuredOutput, guide: dict[str, Any]) -> None:
    sampling = trtllm_sampling(SamplingParams(structured=structured), PROMPT, BUILDER, prompt_param="prompt")
    assert sampling.guide == guide


def test_choices_become_an_escaped_alternation() -> None:
    import re

    pattern = choice_regex(["a.b", "c|d", "(e)"])
    assert [bool(re.fullmatch(pattern, text)) for text in ("a.b", "c|d", "(e)", "axb", "c")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_max_tokens_that_do_not_fit_are_refused_with_openais_code() -> None:
    with pytest.raises(InvalidEngineRequest) as refused:
        sampling_kwargs(SamplingParams(max_tokens=CONTEXT))
    assert (refused.value.param, refused.value.code) == ("max_tokens", CONTEXT_LENGTH_EXCEEDED)
    with pytest.raises(InvalidEngineRequest) as refused:
        sampling_kwargs(SamplingParams(max_tokens=0))
    assert (refused.value.param, refused.value.code) == ("max_tokens", "invalid_value")


def test_a_continued_request_generates_only_what_is_left() -> None:
    continued = BuiltPrompt([1, 2, 3, 40, 41], "Say:", continuation_tokens=2)
    kwargs = sampling_kwargs(SamplingParams(max_tokens=8, min_tokens=5), continued)
    assert (kwargs["max_tokens"], kwargs["min_tokens"]) == (6, 3)


@pytest.mark.parametrize(
    ("reason", "ours"),
    [("stop", "stop"), ("length", "length"), ("cancelled", "abort"), ("timeout", "length"), ("odd", "stop")],
)
def test_finish_reasons(reason: str, ours: str) -> None:
    assert finish_reason(reason) == ours
    assert finish_reason(None) is None


# --- the output reader ------------------------------------------------------------------------------


def test_counts_accumulate_and_the_final_output_ends_the_request() -> None:
    read = reader(SamplingParams(max_tokens=8))
    completion = Completion(0)
    output = Output([completion])
    completion.grow("ab", 10, 11)
    first = read.deltas(output)
    completion.grow("c", 12)
    completion.finish_reason, output.finished = "length", True
    assert rows(first + read.deltas(output)) == [(0, "ab", 2, None, False), (0, "c", 3, "length", True)]
    assert read.ended


def test_n2_interleaved_outputs_with_stale_diffs_count_each_token_once() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0, max_tokens=3), max_tokens=3)
    first, second = Completion(0), Completion(1)
    output = Output([first, second])
    seen: list[Delta] = []
    # One response per sequence, as TensorRT-LLM sends them: only the sequence of the response
    # has its diff counter moved, so the other's `token_ids_diff` repeats its last tokens.
    for completion, text, token in [(first, "a", 10), (second, "x", 20), (first, "b", 11), (second, "y", 21)]:
        completion.grow(text, token)
        seen += read.deltas(output)
    assert second.token_ids_diff == [21] and first.token_ids_diff == [11]  # stale for `first` by now
    first.grow("c", 12)
    second.grow("z", 22)
    output.finished = True
    first.finish_reason = "length"  # TensorRT-LLM sets it only for the final response's sequence
    seen += read.deltas(output)
    texts = {index: "".join(d.text for d in seen if d.index == index) for index in (0, 1)}
    assert texts == {0: "abc", 1: "xyz"}
    assert seen[-1].completion_tokens == 6 and seen[-1].last
    ends = {d.index: d.finish_reason for d in seen if d.finish_reason}
    assert ends == {0: "length", 1: "length"}  # the second's inferred: it used all its tokens
    assert sum(d.last for d in seen) == 1


def test_a_choice_that_ended_without_a_reason_before_its_tokens_ran_out_stopped() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0), max_tokens=8)
    first, second = Completion(0, "a", [1]), Completion(1, "b", [2], finish_reason="stop")
    deltas = read.deltas(Output([first, second], finished=True))
    assert {d.index: d.finish_reason for d in deltas} == {0: "stop", 1: "stop"}


def test_text_that_shrinks_at_a_split_stop_string_never_leaks_its_start() -> None:
    read = reader(SamplingParams(stop=("END",)))
    completion = Completion(0)
    output = Output([completion])
    sent = ""
    for piece, token in [("hello E", 1), ("N", 2)]:
        completion.grow(piece, token)
        sent += "".join(d.text for d in read.deltas(output))
    assert sent == "hello "  # the last len("END") - 1 characters are held back: "EN" stays
    # TensorRT-LLM finds "END" in the detokenized text, cuts the text back to its start and ends.
    completion.grow("D and more", 3)
    completion.text = completion.text[: completion.text.find("END")]
    completion.finish_reason, output.finished = "stop", True
    final = read.deltas(output)
    sent += "".join(d.text for d in final)
    assert sent == "hello " and "E" not in sent
    assert final[-1].finish_reason == "stop" and final[-1].last


def test_a_stop_string_found_here_ends_the_choice_even_if_the_engine_missed_it() -> None:
    read = reader(SamplingParams(stop=("##",)))
    completion = Completion(0)
    completion.grow("ab#", 1)
    first = read.deltas(Output([completion]))
    completion.grow("#cd", 2)
    final = read.deltas(Output([completion]))
    assert "".join(d.text for d in first + final) == "ab"
    assert final[-1].finish_reason == "stop" and final[-1].last and read.ended
    assert read.deltas(Output([completion], finished=True)) == []  # nothing after the end


def test_cancelled_is_an_abort() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0))
    outputs = [
        Completion(0, "a", [1], finish_reason="cancelled"),
        Completion(1, "", [], finish_reason="cancelled"),
    ]
    deltas = read.deltas(Output(outputs, finished=True))
    assert rows(deltas) == [(0, "a", 1, "abort", False), (1, "", 1, "abort", True)]


def test_cut_off_ends_every_running_choice_with_abort() -> None:
    read = reader(SamplingParams(n=2, temperature=1.0))
    read.deltas(Output([Completion(0, "a", [1]), Completion(1, "b", [2])]))
    assert rows(read.cut_off()) == [(0, "", 2, "abort", False), (1, "", 2, "abort", True)]
    assert read.cut_off() == []


def test_greedy_copies_repeat_each_delta_and_count_each_copy() -> None:
    read = reader(SamplingParams(n=3, temperature=0.0))
    deltas = read.deltas(Output([Completion(0, "ab", [10, 11], finish_reason="stop")], finished=True))
    assert [(d.index, d.text, d.finish_reason) for d in deltas] == [
        (0, "ab", "stop"),
        (1, "ab", "stop"),
        (2, "ab", "stop"),
    ]
    assert deltas[-1].completion_tokens == 6 and [d.last for d in deltas] == [False, False, True]


def test_logprobs_are_decoded_ranked_and_clamped() -> None:
    read = reader(SamplingParams(logprobs=2))
    completion = Completion(0)
    completion.grow("<7><8>", 7, 8)
    completion.logprobs = [
        {7: Logprob(-0.5, 1), 9: Logprob(-1.5, 2), 4: Logprob(-3.0, 3)},
        {3: Logprob(-0.1, 1), 8: Logprob(float("-inf"), 5)},
    ]
    (delta,) = read.deltas(Output([completion]))
    assert delta.logprobs == (
        TokenLogprob("<7>", -0.5, (TopLogprob("<7>", -0.5), TopLogprob("<9>", -1.5))),
        TokenLogprob("<8>", LOWEST_LOGPROB, (TopLogprob("<3>", -0.1), TopLogprob("<8>", LOWEST_LOGPROB))),
    )


def test_logprobs_wait_for_their_tokens_and_come_once() -> None:
    read = reader(SamplingParams(logprobs=0))
    completion = Completion(0)
    completion.grow("<7>", 7)
    completion.logprobs = [{7: Logprob(-0.5, 1)}]
    first = read.deltas(Output([completion]))
    completion.grow("<8>", 8)  # its log probability has not arrived yet
    second = read.deltas(Output([completion]))
    completion.logprobs.append([-0.25][0])  # the sampled token's alone, as a float
    third = read.deltas(Output([completion], finished=True))
    assert [len(d.logprobs) for d in first + second + third] == [1, 0, 1]
    assert third[-1].logprobs == (TokenLogprob("<8>", -0.25),)
    assert first[0].logprobs[0].top == ()  # top 0: the chosen token alone


def test_echo_prefixes_the_prompt_and_its_logprobs_once_per_choice() -> None:
    read = reader(SamplingParams(logprobs=1, echo=True, n=2, temperature=0.0))
    completion = Completion(0)
    completion.grow("<5>", 5)
    completion.logprobs = [{5: Logprob(-0.2, 1)}]
    # Entry t is the distribution after prompt token t: token 2 is read from entry 0, token 3 from 1.
    completion.prompt_logprobs = [{2: Logprob(-1.0, 1)}, {9: Logprob(-0.3, 1)}, {5: Logprob(-0.2, 1)}]
    first = read.deltas(Output([completion]))
    completion.grow("<6>", 6)
    later = read.deltas(Output([completion]))
    assert [d.text for d in first] == ["Say:<5>", "Say:<5>"]
    assert [d.text for d in later] == ["<6>", "<6>"]
    echoed = first[0].logprobs[:3]
    assert [(entry.token, entry.logprob) for entry in echoed] == [("<1>", None), ("<2>", -1.0), ("<3>", None)]
    assert echoed[2].top == (TopLogprob("<9>", -0.3),)


def test_a_continued_request_counts_its_earlier_tokens() -> None:
    continued = BuiltPrompt([1, 2, 3, 40, 41], "Say:", continuation_tokens=2)
    read = reader(SamplingParams(max_tokens=8), continued)
    (delta,) = read.deltas(Output([Completion(0, "x", [5], finish_reason="length")], finished=True))
    assert (delta.prompt_tokens, delta.completion_tokens, delta.last) == (3, 3, True)


def test_a_final_output_with_nothing_new_still_ends_the_request() -> None:
    read = reader(SamplingParams())
    completion = Completion(0)
    completion.grow("ab", 1, 2)
    read.deltas(Output([completion]))
    completion.finish_reason = "stop"
    (end,) = read.deltas(Output([completion], finished=True))
    assert (end.text, end.finish_reason, end.last, end.completion_tokens) == ("", "stop", True, 2)


def test_echoed_logprobs_come_from_whichever_choice_carries_them() -> None:
    read = reader(SamplingParams(logprobs=1, echo=True, n=2, temperature=1.0))
    first, second = Completion(0), Completion(1)
    second.grow("<5>", 5)  # the second choice answers first, with the prompt's log probabilities
    second.logprobs = [{5: Logprob(-0.2, 1)}]
    second.prompt_logprobs = [{2: Logprob(-1.0, 1)}, {3: Logprob(-0.5, 1)}, {5: Logprob(-0.2, 1)}]
    (delta,) = read.deltas(Output([first, second]))
    assert delta.index == 1 and delta.text == "Say:<5>"
    assert [entry.logprob for entry in delta.logprobs] == [None, -1.0, -0.5, -0.2]


# --- what TensorRT-LLM raises for a request -----------------------------------------------------


class RequestError(RuntimeError):
    """`tensorrt_llm.executor.utils.RequestError` (1.2): what a request's stream raises with the
    message its executor ended the request with."""


# xgrammar's words for a lookbehind, as TensorRT-LLM 1.2's executor passes them on (PR #9078).
LOOKBEHIND = (
    "Guided decoding error: [18:23:55] /project/cpp/regex_converter.cc:83: "
    "Regex parsing error at position 3: Lookbehind is not supported yet.\n"
)


def test_a_guide_the_grammar_backend_cannot_compile_is_the_clients_error() -> None:
    refused = stream_refusal(RequestError(LOOKBEHIND), before_output=True, request_error=RequestError)
    assert isinstance(refused, InvalidEngineRequest)
    assert str(refused) == (
        "The model's engine refused the request: "
        "Guided decoding error: Regex parsing error at position 3: Lookbehind is not supported yet."
    )
    assert refused.code == "invalid_value"
    # A reason that quotes a long grammar is cut.
    long = stream_refusal(
        RequestError("Guided decoding error: " + "x" * 10_000), before_output=True, request_error=RequestError
    )
    assert long is not None and len(str(long)) < MAX_REASON_CHARS + 100


def test_the_executors_other_request_errors_stay_the_engines() -> None:
    # After the first output, a guide's failure is a token the grammar refused mid-way: the engine's.
    assert stream_refusal(RequestError(LOOKBEHIND), before_output=False, request_error=RequestError) is None
    # A failed step ends every request with a RequestError too.
    forward = RequestError("Encountered an error in forward function: CUDA error: an illegal memory access")
    assert stream_refusal(forward, before_output=True, request_error=RequestError) is None
    # Anything but a RequestError (a dead executor, a closed queue) is the engine's, whatever it says.
    assert stream_refusal(RuntimeError(LOOKBEHIND), before_output=True, request_error=RequestError) is None


def test_what_tensorrt_llm_refuses_of_a_requests_arguments_is_the_clients_error() -> None:
    # SamplingParams._validate (and GuidedDecodingParams._validate, which it calls) raise ValueError.
    refused = submit_refusal(ValueError("Only one guide can be used for a request, but got 2."))
    assert isinstance(refused, InvalidEngineRequest)
    assert (
        str(refused)
        == "The model's engine refused the request: Only one guide can be used for a request, but got 2."
    )
    # Without the machine's paths.
    path = submit_refusal(ValueError("cannot read /opt/models/x/tokenizer.json"))
    assert path is not None and str(path).endswith("cannot read <path>"), str(path)
    # An engine shutting down is not the client's doing; nor is a RequestError as a request is
    # submitted (the prompt against max_num_tokens, which the engine checks itself before).
    assert submit_refusal(RuntimeError("LLM is shutting down")) is None
    too_long = "The sum of prompt length (9000.0), query length (0) should not exceed max_num_tokens (8192)"
    assert submit_refusal(RequestError(too_long)) is None
