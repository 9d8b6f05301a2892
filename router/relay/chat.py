"""Result chunks → OpenAI chat completion: server-sent events, or one assembled response.

Each choice's first event carries the assistant role. Under a named `tool_choice` the generated text
is the call's arguments, streamed as they come; under `required` it is a JSON list of calls, which
can only be turned into `tool_calls` once complete, so that choice's text is held back until it
finishes. Under `auto` the worker parses the calls in the model's own syntax and sends them with
the choice's last chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.intake.tools import TEXT, ToolPlan, new_call_id, parse_required_calls
from router.openai.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageOut,
    ChoiceLogprobs,
    FunctionCallOut,
    TokenLogprobOut,
    ToolCallDelta,
    ToolCallOut,
    TopLogprobOut,
)
from router.openai.common import LOWEST_LOGPROB
from router.openai.errors import OpenAIError
from router.relay.sse import (
    SSE_DONE,
    ChoiceText,
    error_for,
    events_of,
    gather_choices,
    openai_usage,
    sse_error,
    sse_event,
)
from switchboard.wire import Chunk, Job, TokenLogprob, ToolCall


class ChatRelay:
    """Relays one job's chunks as an OpenAI chat completion."""

    stream_end = SSE_DONE

    def __init__(
        self,
        *,
        job_id: str,
        model: str,
        created: int,
        n: int = 1,
        include_usage: bool = False,
        logprobs: bool = False,
        tools: ToolPlan = TEXT,
        service_tier: str = "default",
    ) -> None:
        self.completion_id = f"chatcmpl-{job_id}"
        self.service_tier = service_tier
        self.model = model
        self.created = created
        self.n = n
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.tools = tools
        self._started: set[int] = set()
        self._held: dict[int, list[str]] = {}
        self._call_ids: dict[int, str] = {}

    def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Server-sent events for a streamed response, ending with ``data: [DONE]``."""
        return events_of(self, chunks)

    def chunk_events(self, chunk: Chunk) -> list[bytes]:
        """The events of one chunk: its choice's, and the usage after the last; a failed job's error."""
        if chunk.error is not None:
            return [sse_event(error_for(chunk.error, self.model).body())]
        events = []
        choice = self._stream_choice(chunk)
        if choice is not None:
            events.append(sse_event(self._event([choice])))
        if chunk.is_last and self.include_usage:
            events.append(sse_event(self._event([], usage=True, last=chunk)))
        return events

    def replay(self, earlier: list[Chunk]) -> None:
        """Take in the chunks whose events the client had before it resumed the stream
        (`Last-Event-ID`), so that the next events go on from them (roles sent, held tool-call text)."""
        for chunk in earlier:
            self._stream_choice(chunk)

    def error_event(self, error: OpenAIError) -> bytes:
        """The closing event of a stream that fails after its headers were sent."""
        return sse_error(error)

    async def assemble(self, chunks: AsyncIterator[Chunk]) -> ChatCompletion:
        """One response for `stream: false`; raises the job's error if it failed."""
        choices, usage = await gather_choices(chunks, self.model, self.n)
        return ChatCompletion(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=[self._whole_choice(index, choice) for index, choice in enumerate(choices)],
            usage=usage,
            service_tier=self.service_tier,
        )

    # --- streamed ---------------------------------------------------------------------------------

    def _stream_choice(self, chunk: Chunk) -> ChatChunkChoice | None:
        if not (chunk.text or chunk.finish_reason or chunk.logprobs or chunk.tool_calls):
            return None
        first = chunk.index not in self._started
        self._started.add(chunk.index)
        finish: str | None = chunk.finish_reason
        if self.tools.mode == "required":
            delta, finish = self._held_calls(chunk)
        elif self.tools.mode == "named":
            # A finishing chunk without text adds nothing to the call's arguments.
            call = self._named_call_delta(chunk.index, chunk.text, first) if chunk.text or first else None
            delta = ChatDelta(tool_calls=[call] if call is not None else None)
        elif chunk.tool_calls:
            delta = ChatDelta(content=chunk.text or None, tool_calls=parsed_call_deltas(chunk.tool_calls))
            finish = "tool_calls"
        else:
            delta = ChatDelta(content=chunk.text if chunk.text or first else None)
        if first:
            delta.role = "assistant"
        logprobs = self._logprobs(chunk.logprobs) if chunk.logprobs else None
        if delta == ChatDelta() and finish is None and logprobs is None:
            return None
        return ChatChunkChoice(index=chunk.index, delta=delta, finish_reason=finish, logprobs=logprobs)

    def _named_call_delta(self, index: int, arguments: str, first: bool) -> ToolCallDelta:
        if not first:
            return ToolCallDelta(index=0, function=FunctionCallOut(arguments=arguments))
        self._call_ids[index] = new_call_id()
        return ToolCallDelta(
            index=0,
            id=self._call_ids[index],
            type="function",
            function=FunctionCallOut(name=self.tools.function, arguments=arguments),
        )

    def _held_calls(self, chunk: Chunk) -> tuple[ChatDelta, str | None]:
        held = self._held.setdefault(chunk.index, [])
        held.append(chunk.text)
        if chunk.finish_reason is None:
            return ChatDelta(), None
        text = "".join(self._held.pop(chunk.index))
        calls = parse_required_calls(text)
        if calls is None:  # cut short (length) or aborted: the client gets what there is, as text
            return ChatDelta(content=text), chunk.finish_reason
        deltas = [
            ToolCallDelta(
                index=position,
                id=new_call_id(),
                type="function",
                function=FunctionCallOut(name=name, arguments=arguments),
            )
            for position, (name, arguments) in enumerate(calls)
        ]
        return ChatDelta(tool_calls=deltas), "tool_calls"

    def _event(
        self, choices: list[ChatChunkChoice], *, usage: bool = False, last: Chunk | None = None
    ) -> ChatCompletionChunk:
        event = ChatCompletionChunk(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=choices,
            service_tier=self.service_tier,
        )
        if self.include_usage:
            event.usage = openai_usage(last) if usage and last is not None else None
        return event

    # --- assembled --------------------------------------------------------------------------------

    def _whole_choice(self, index: int, choice: ChoiceText) -> ChatChoice:
        text, finish = choice.text, choice.finish_reason
        message = ChatMessageOut(content=text)
        if self.tools.mode == "named":
            call = ToolCallOut(
                id=new_call_id(), function=FunctionCallOut(name=self.tools.function, arguments=text)
            )
            message = ChatMessageOut(content=None, tool_calls=[call])
        elif choice.tool_calls:
            message = ChatMessageOut(
                content=text or None,
                tool_calls=[
                    ToolCallOut(
                        id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments)
                    )
                    for call in choice.tool_calls
                ],
            )
            finish = "tool_calls"
        elif self.tools.mode == "required":
            calls = parse_required_calls(text)
            if calls is not None:
                message = ChatMessageOut(
                    content=None,
                    tool_calls=[
                        ToolCallOut(
                            id=new_call_id(), function=FunctionCallOut(name=name, arguments=arguments)
                        )
                        for name, arguments in calls
                    ],
                )
                finish = "tool_calls"
        return ChatChoice(
            index=index, message=message, finish_reason=finish, logprobs=self._logprobs(choice.logprobs)
        )

    def _logprobs(self, logprobs: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> ChoiceLogprobs | None:
        if not self.logprobs:
            return None
        return ChoiceLogprobs(content=[chat_logprob(entry) for entry in logprobs])


def parsed_call_deltas(calls: tuple[ToolCall, ...]) -> list[ToolCallDelta]:
    """Calls the worker parsed from the model's text, each whole in one stream delta."""
    return [
        ToolCallDelta(
            index=position,
            id=call.id,
            type="function",
            function=FunctionCallOut(name=call.name, arguments=call.arguments),
        )
        for position, call in enumerate(calls)
    ]


def chat_logprob(entry: TokenLogprob) -> TokenLogprobOut:
    """A token's log probabilities in the chat API's shape (with each token's UTF-8 bytes)."""
    return TokenLogprobOut(
        token=entry.token,
        logprob=entry.logprob if entry.logprob is not None else LOWEST_LOGPROB,
        bytes=list(entry.token.encode()),
        top_logprobs=[
            TopLogprobOut(token=top.token, logprob=top.logprob, bytes=list(top.token.encode()))
            for top in entry.top
        ],
    )


def chat_relay(request: ChatCompletionRequest, job: Job, tools: ToolPlan) -> ChatRelay:
    """The relay of `job`'s chunks as the answer to `request`."""
    return ChatRelay(
        job_id=job.id,
        model=request.model,
        created=int(job.created),
        n=request.n,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        logprobs=request.logprobs,
        tools=tools,
        service_tier=job.tier,
    )
