"""Result chunks → an OpenAI response (`/v1/responses`): its stream of typed events, or one object.

The stream is OpenAI's: `response.created` and `response.in_progress`, then each output item opened,
filled by deltas and closed (`response.output_item.added` ... `response.output_item.done`), then
`response.completed` (or `response.incomplete` when `max_output_tokens` cut the answer short, or
`response.failed`) with the whole response. Every event is framed with its `event:` line and counts
in `sequence_number`; there is no `data: [DONE]`. Tool calls follow the chat relay's plan
(`router.relay.chat`): a named function's arguments stream as they come, a `required` answer is held
until it is whole, and calls parsed from the model's own syntax arrive with its last chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from router.intake.tools import TEXT, ToolPlan, parse_required_calls
from router.openai.chat import TokenLogprobOut
from router.openai.errors import OpenAIError
from router.openai.responses import (
    IncompleteDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    StreamEvent,
    TextFormatSpec,
    TextOptions,
)
from router.relay.chat import chat_logprob
from router.relay.sse import error_for, events_of, gather_choices, openai_usage
from switchboard.wire import Chunk, Job, TokenLogprob
from switchboard.wire import Usage as WireUsage

_json = msgspec.json.Encoder()


class ResponsesRelay:
    """Relays one job's chunks as an OpenAI response; `template` holds what the request asked (the
    response echoes it) and is copied for every snapshot the stream sends."""

    stream_end = b""

    def __init__(
        self, *, job_id: str, template: ResponseObject, logprobs: bool = False, tools: ToolPlan = TEXT
    ) -> None:
        self._job_id = job_id
        self._template = template
        self.model = template.model
        self.logprobs = logprobs
        self.tools = tools
        self._sequence = 0
        self._began = False
        self._output: list[OutputItem] = []
        self._message: OutputMessage | None = None  # the message item being streamed
        self._call: OutputFunctionCall | None = None  # a named function's call being streamed
        self._held: list[str] = []  # a `required` answer's text, until it is whole
        self._finish_reason: str | None = None

    # --- streamed ---------------------------------------------------------------------------------

    def events(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        """Every chunk's events, up to the response's end or its failure."""
        return events_of(self, chunks)

    def chunk_events(self, chunk: Chunk) -> list[bytes]:
        """The events of one chunk: the response's beginning before the first, its items' deltas, and
        after the last its items closed and the response whole; a failed job's `response.failed`."""
        events = self._beginning()
        if chunk.error is not None:
            return [*events, self._failed(error_for(chunk.error, self.model))]
        events += self._content_events(chunk)
        if chunk.is_last:
            events.append(self._end(chunk))
        return events

    def _content_events(self, chunk: Chunk) -> list[bytes]:
        """What the chunk adds to the answer's items, and their ends after its last text."""
        if chunk.index != 0:  # a response has one answer (n is 1)
            return []
        events = []
        if self.tools.mode == "required":
            self._held.append(chunk.text)
        elif self.tools.mode == "named":
            events += self._call_delta(chunk.text)
        elif chunk.text:
            events += self._text_delta(chunk.text, chunk.logprobs)
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
        if chunk.finish_reason is not None or chunk.is_last:
            events += self._choice_end(chunk)
        return events

    def replay(self, earlier: list[Chunk]) -> None:
        """Take in the chunks whose events the client had before it resumed the stream, so that the
        next events go on from them (the same item ids, the next sequence numbers)."""
        for chunk in earlier:
            self.chunk_events(chunk)

    def error_event(self, error: OpenAIError) -> bytes:
        """The closing event of a stream that fails after its headers were sent."""
        return self._beginning_bytes() + self._failed(error)

    def _beginning(self) -> list[bytes]:
        if self._began:
            return []
        self._began = True
        snapshot = self._snapshot("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def _beginning_bytes(self) -> bytes:
        return b"".join(self._beginning())

    def _text_delta(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> list[bytes]:
        events = []
        if self._message is None:
            self._message = OutputMessage(id=self._item_id("msg"), status="in_progress", content=[])
            index = len(self._output)
            events.append(self._event("response.output_item.added", output_index=index, item=self._message))
            empty = OutputText(text="")
            events.append(self._item_event("response.content_part.added", self._message, part=empty))
            self._message.content.append(OutputText(text=""))
        if not text:
            return events
        part = self._message.content[0]
        part.text += text
        added = self._logprobs(logprobs)
        part.logprobs.extend(added)
        events.append(
            self._item_event("response.output_text.delta", self._message, delta=text, logprobs=added)
        )
        return events

    def _call_delta(self, arguments: str) -> list[bytes]:
        events = []
        if self._call is None:
            assert self.tools.function is not None
            self._call = self._function_call(self.tools.function, "", status="in_progress")
            index = len(self._output)
            events.append(self._event("response.output_item.added", output_index=index, item=self._call))
        if arguments:
            self._call.arguments += arguments
            events.append(
                self._item_event("response.function_call_arguments.delta", self._call, delta=arguments)
            )
        return events

    def _choice_end(self, chunk: Chunk) -> list[bytes]:
        """The open items closed, and the calls the answer made (held or parsed) added whole."""
        status = "incomplete" if chunk.finish_reason == "length" else "completed"
        events = []
        if self.tools.mode == "required" and self._held:
            text, self._held = "".join(self._held), []
            calls = parse_required_calls(text)
            if calls is None:  # cut short or aborted: the client gets what there is, as text
                events += self._text_delta(text, ())
            else:
                events += [e for name, arguments in calls for e in self._whole_call(name, arguments, None)]
        nothing_yet = self._message is None and not self._output and not chunk.tool_calls
        if self.tools.mode in ("text", "auto") and nothing_yet:
            # An empty answer is still a message, as a chat completion's is an empty content.
            events += self._text_delta("", ())
        if self._call is not None:
            events += self._close_call(self._call, status)
            self._call = None
        if self._message is not None:
            events += self._close_message(self._message, status)
            self._message = None
        for call in chunk.tool_calls:
            events += self._whole_call(call.name, call.arguments, call.id)
        return events

    def _close_message(self, message: OutputMessage, status: str) -> list[bytes]:
        part = message.content[0]
        message.status = "incomplete" if status == "incomplete" else "completed"
        events = [
            self._item_event("response.output_text.done", message, text=part.text, logprobs=part.logprobs),
            self._item_event("response.content_part.done", message, part=part),
            self._event("response.output_item.done", output_index=len(self._output), item=message),
        ]
        self._output.append(message)
        return events

    def _whole_call(self, name: str, arguments: str, call_id: str | None) -> list[bytes]:
        call = self._function_call(name, arguments, status="in_progress", call_id=call_id)
        index = len(self._output)
        added = self._event("response.output_item.added", output_index=index, item=call)
        delta = self._item_event("response.function_call_arguments.delta", call, delta=arguments)
        return [added, delta, *self._close_call(call, "completed")]

    def _close_call(self, call: OutputFunctionCall, status: str) -> list[bytes]:
        call.status = "incomplete" if status == "incomplete" else "completed"
        done = self._item_event(
            "response.function_call_arguments.done", call, arguments=call.arguments, name=call.name
        )
        events = [done, self._event("response.output_item.done", output_index=len(self._output), item=call)]
        self._output.append(call)
        return events

    def _end(self, chunk: Chunk) -> bytes:
        response = self._finished(chunk)
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        return self._event(kind, response=response)

    def _failed(self, error: OpenAIError) -> bytes:
        failure = ResponseError(code=error.code or error.error_type, message=error.message)
        return self._event("response.failed", response=self._snapshot("failed", error=failure))

    def _event(self, kind: str, **fields: object) -> bytes:
        event = StreamEvent(type=kind, sequence_number=self._sequence, **fields)  # type: ignore[arg-type]
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _json.encode(event) + b"\n\n"

    def _item_event(self, kind: str, item: OutputItem, **fields: object) -> bytes:
        """An event of `item`, which is open: the next of the output (items are closed in order)."""
        if isinstance(item, OutputMessage):
            fields["content_index"] = 0
        return self._event(kind, output_index=len(self._output), item_id=item.id, **fields)

    # --- assembled --------------------------------------------------------------------------------

    async def assemble(self, chunks: AsyncIterator[Chunk]) -> ResponseObject:
        """One response for `stream: false`; raises the job's error if it failed."""
        choices, usage = await gather_choices(chunks, self.model, 1)
        choice = choices[0]
        whole = Chunk(
            text=choice.text,
            logprobs=tuple(choice.logprobs),
            tool_calls=tuple(choice.tool_calls),
            finish_reason=choice.finish_reason,  # type: ignore[arg-type]
            usage=WireUsage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens),
        )
        self._began = True  # the items the events would build, without the events' beginning
        self._content_events(whole)
        return self._finished(whole)

    # --- shared -----------------------------------------------------------------------------------

    def _finished(self, last: Chunk) -> ResponseObject:
        usage = openai_usage(last)
        response = self._snapshot("incomplete" if self._finish_reason == "length" else "completed")
        response.usage = ResponseUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )
        if response.status == "incomplete":
            response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
        return response

    def _snapshot(self, status: str, *, error: ResponseError | None = None) -> ResponseObject:
        return msgspec.structs.replace(
            self._template, model=self.model, status=status, output=list(self._output), error=error
        )

    def _item_id(self, prefix: str) -> str:
        # From the job's id, so that a resumed stream names its items as the first connection did.
        return f"{prefix}_{self._job_id}_{len(self._output)}"

    def _function_call(
        self, name: str, arguments: str, *, status: str, call_id: str | None = None
    ) -> OutputFunctionCall:
        item_id = self._item_id("fc")
        return OutputFunctionCall(
            id=item_id,
            call_id=call_id or f"call_{self._job_id}_{len(self._output)}",
            name=name,
            arguments=arguments,
            status=status,  # type: ignore[arg-type]
        )

    def _logprobs(self, logprobs: tuple[TokenLogprob, ...]) -> list[TokenLogprobOut]:
        if not self.logprobs:
            return []
        return [chat_logprob(entry) for entry in logprobs]


def responses_relay(
    request: ResponsesRequest, job: Job, tools: ToolPlan, *, model: str, logprobs: bool
) -> ResponsesRelay:
    """The relay of `job`'s chunks as the answer to `request` (which the response echoes) by `model`."""
    template = ResponseObject(
        id=f"resp_{job.id}",
        created_at=int(job.created),
        model=model,
        status="in_progress",
        output=[],
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=list(request.tools or ()),
        tool_choice=request.tool_choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls is not False,
        text=request.text or TextOptions(format=TextFormatSpec(type="text")),
        metadata=request.metadata or {},
        user=request.user,
        service_tier=job.tier,
    )
    return ResponsesRelay(job_id=job.id, template=template, logprobs=logprobs, tools=tools)
