"""The batch runner: one front door at a time works through the batches not yet ended.

The front door holding the runner's lease (a Redis key it renews) takes each active batch through
OpenAI's states: `validating` (its input file read from the store, every line's URL the batch's
endpoint) → `in_progress` (its lines run a few at a time, `LineRunner`, each finished line written
to the batch's results at once) → `finalizing` (the output and error files written, in the input's
order) → `completed`; or `failed` (a file that cannot run), `expired` (its 24-hour window passed
first) or, once cancelled, `cancelling` → `cancelled` (the lines running end, the rest never start,
and what finished is in the files). A front door that dies loses the lease; another takes it within
LEASE_S and goes on from the results: a line that was running when it died runs again, once.

Lines run as the requests they are, through the same checks and queue, but in the batch tier
(`wire.TIERS`): their jobs wait in their models' batch streams, which a worker reads only with slots
no interactive job wants, and which neither load a model nor keep one warm. Up to
`batches.max_lines_in_flight` lines are queued at once over every batch (and a key's
`max_batch_lines_in_flight` over its own), enough to keep every spare slot busy; a line's deadline
is its batch's window. A line holds none of its key's requests per minute or requests in flight:
those bound what a client sends at once, and the runner bounds the lines. A batch whose window would
not hold at its pace moves up to the flex tier (`router.batches.deadlines`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

import msgspec
import redis.asyncio as aioredis

from router.admission.auth import Caller
from router.batches.deadlines import Progress, behind
from router.batches.lines import BatchLine, LineAnswer, LineRunner
from router.batches.records import BatchRecord, BatchRecords, LineResult
from router.files.service import FileService
from router.openai.batches import BatchError, line_error, line_output
from router.queue.move_waiting import requeue_waiting
from switchboard import keys
from switchboard.config import BatchesConfig
from switchboard.tasks import TaskSet, poll
from switchboard.wire import Tier

logger = logging.getLogger(__name__)

LEASE_S = 15.0
# A pass every half second while batches run; every IDLE_PASS_S while none does (an idle pass is
# one Redis command).
PASS_EVERY_S = 0.5
IDLE_PASS_S = 2.0
# A line refused for now (a rate limit, no worker yet) waits this long before it runs again.
RETRY_AFTER_S = 2.0
_line_decoder = msgspec.json.Decoder(BatchLine)


class BatchRunner:
    """Runs the active batches while this front door holds the runner's lease."""

    def __init__(
        self,
        redis: aioredis.Redis,
        records: BatchRecords,
        files: FileService,
        lines: LineRunner,
        caller_of: Callable[[str], Caller | None],
        router_id: str,
        settings: BatchesConfig,
    ) -> None:
        self._redis = redis
        self._records = records
        self._files = files
        self._lines = lines
        self._caller_of = caller_of
        self._router_id = router_id
        self._settings = settings
        # The models each batch's lines name, and the batches moved up to the flex tier.
        self._models: dict[str, set[str]] = {}
        self._escalated: set[str] = set()
        self._expires: dict[str, float] = {}
        # Each batch's lines, read once per runner from its input file.
        self._inputs: dict[str, list[BatchLine]] = {}
        self._running: dict[str, set[str]] = {}
        # Each batch's finished lines, as far as this runner knows (read once, then kept up to date).
        self._finished: dict[str, set[str]] = {}
        # The key each batch runs for, and the batches being cancelled (no line of theirs starts).
        self._callers: dict[str, Caller | None] = {}
        self._stopping: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry_at: dict[tuple[str, str], float] = {}
        self._busy = False
        self._line_tasks: dict[str, set[asyncio.Task[None]]] = {}

    def start(self, tasks: TaskSet) -> None:
        tasks.start(poll(self.run_pass, self._pace, "run batches"), "batch runner")

    def _pace(self) -> float:
        return PASS_EVERY_S if self._busy else IDLE_PASS_S

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run_pass(self) -> None:
        """One pass over the active batches, if this front door holds (or takes) the lease."""
        active = await self._records.active()
        self._busy = bool(active)
        # No batch to run: no lease is taken (an idle front door asks Redis one thing a pass, and
        # leaves no key behind).
        if not active or not await self._hold_lease():
            # Another front door runs the batches: what this one knew of them goes stale.
            self._inputs.clear()
            self._finished.clear()
            return
        for batch_id in active:
            record = await self._records.get(batch_id)
            if record is not None:
                await self._advance(record)

    async def _hold_lease(self) -> bool:
        lease, ttl_ms = keys.batch_runner_lease(), int(LEASE_S * 1000)
        if await self._redis.set(lease, self._router_id, nx=True, px=ttl_ms):
            return True
        holder = cast(bytes | None, await self._redis.get(lease))
        if holder is not None and holder.decode() == self._router_id:
            await self._redis.pexpire(lease, ttl_ms)
            return True
        return False

    async def _advance(self, record: BatchRecord) -> None:
        now = time.time()
        if record.status == "validating":
            await self._validate(record, now)
        elif record.status == "in_progress" and now >= record.expires_at:
            await self._finish(record, "expired")
        elif record.status == "in_progress":
            await self._submit(record, now)
        elif record.status == "cancelling":
            self._stopping.add(record.id)
            if not self._running.get(record.id):
                await self._finish(record, "cancelled")
        elif record.status == "finalizing":
            await self._finish(record, "completed")

    async def _validate(self, record: BatchRecord, now: float) -> None:
        lines, errors = await self._read_input(record)
        if errors:
            failed = msgspec.structs.replace(record, status="failed", failed_at=now, errors=tuple(errors))
            await self._records.save_if(failed, "validating")
            return
        self._inputs[record.id] = lines
        started = msgspec.structs.replace(record, status="in_progress", in_progress_at=now, total=len(lines))
        await self._records.save_if(started, "validating")  # a cancel meanwhile stands

    async def _read_input(self, record: BatchRecord) -> tuple[list[BatchLine], list[BatchError]]:
        """The batch's lines from its input file (checked on upload), each bound for its endpoint."""
        file = await self._files.record(record.input_file_id)
        if file is None:
            return [], [
                BatchError(
                    code="file_not_found", message="The input file was deleted.", param="input_file_id"
                )
            ]
        data = b"".join([chunk async for chunk in await self._files.content(file)])
        lines: list[BatchLine] = []
        errors: list[BatchError] = []
        for number, raw in enumerate(data.splitlines(), 1):
            if not raw.strip():
                continue
            line = _line_decoder.decode(raw)
            if line.url != record.endpoint:
                message = f"The line's url {line.url} is not the batch's endpoint {record.endpoint}."
                errors.append(BatchError(code="invalid_url", message=message, param="url", line=number))
            lines.append(line)
        return lines, errors

    async def _submit(self, record: BatchRecord, now: float) -> None:
        lines = self._inputs.get(record.id)
        if lines is None:  # taken over from a runner that died: read its input again
            lines, _ = await self._read_input(record)
            self._inputs[record.id] = lines
        finished = self._finished.get(record.id)
        if finished is None:  # the results so far, read once: this runner adds what it finishes
            finished = self._finished[record.id] = await self._records.finished_ids(record.id)
        running = self._running.setdefault(record.id, set())
        if len(finished) >= len(lines) and not running:
            await self._finalize(record, now)
            return
        self._callers[record.id] = _line_caller(self._caller_of(record.owner))
        self._expires[record.id] = record.expires_at
        if record.id not in self._escalated and behind(
            _progress(record, finished, len(lines)), now, self._settings.deadline_margin_s
        ):
            await self._escalate(record, lines)
        self._start_lines(record.id, now)

    async def _escalate(self, record: BatchRecord, lines: list[BatchLine]) -> None:
        """Move the batch up to the flex tier: its next lines are queued there, and the lines waiting
        in its models' batch tier move there now (those of other batches on the same models too:
        they wait behind it all the same)."""
        self._escalated.add(record.id)
        moved = 0
        for model in _models_of(lines):
            moved += await requeue_waiting(
                self._redis,
                keys.job_stream(model, "batch"),
                lambda job: msgspec.structs.replace(job, tier="flex"),
            )
        logger.warning(
            "a batch moves up to the flex tier: its window would not hold in the batch tier",
            extra={"batch_id": record.id, "expires_at": record.expires_at, "lines_moved": moved},
        )

    def _start_lines(self, batch_id: str, now: float) -> None:
        """Start the batch's next lines, up to `max_lines_in_flight` over all batches and its key's
        own bound over the key's: at each pass, and as each line ends (so a batch of fast lines is not
        paced by the passes)."""
        lines, finished = self._inputs.get(batch_id), self._finished.get(batch_id)
        running = self._running.get(batch_id)
        if lines is None or finished is None or running is None:  # ended, or no longer this runner's
            return
        caller = self._callers.get(batch_id)
        for line in lines:
            if self._lines_in_flight() >= self._settings.max_lines_in_flight or self._at_key_bound(caller):
                break
            if line.custom_id in finished or line.custom_id in running:
                continue
            if self._retry_at.get((batch_id, line.custom_id), 0.0) > now:
                continue
            running.add(line.custom_id)
            self._start(batch_id, line, caller)

    def _lines_in_flight(self) -> int:
        return sum(len(running) for running in self._running.values())

    def _at_key_bound(self, caller: Caller | None) -> bool:
        """Whether the key's batches run as many lines as it may (`max_batch_lines_in_flight`)."""
        if caller is None or caller.max_batch_lines_in_flight is None:
            return False
        own = [
            batch_id
            for batch_id, other in self._callers.items()
            if other is not None and other.owner == caller.owner
        ]
        return (
            sum(len(self._running.get(batch_id, ())) for batch_id in own) >= caller.max_batch_lines_in_flight
        )

    def _start(self, batch_id: str, line: BatchLine, caller: Caller | None) -> None:
        task = asyncio.create_task(self._run_line(batch_id, line, caller))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        batch_tasks = self._line_tasks.setdefault(batch_id, set())
        batch_tasks.add(task)
        task.add_done_callback(batch_tasks.discard)

    async def _run_line(self, batch_id: str, line: BatchLine, caller: Caller | None) -> None:
        try:
            answer = await self._answer(batch_id, line, caller)
            if answer.passes:
                self._retry_at[(batch_id, line.custom_id)] = time.time() + RETRY_AFTER_S
                return
            await self._records.finish_line(batch_id, line.custom_id, _result(line, answer))
            self._finished.setdefault(batch_id, set()).add(line.custom_id)
        except Exception:  # Redis away, say: the line runs again on a later pass
            logger.exception("could not record a batch line", extra={"batch_id": batch_id})
        finally:
            self._running.get(batch_id, set()).discard(line.custom_id)
        if not self._cancelled_here(batch_id):
            self._start_lines(batch_id, time.time())

    def _cancelled_here(self, batch_id: str) -> bool:
        return batch_id in self._stopping

    async def _answer(self, batch_id: str, line: BatchLine, caller: Caller | None) -> LineAnswer:
        if caller is None:
            body = {
                "error": {
                    "message": "The API key that created this batch was removed.",
                    "type": "invalid_request_error",
                }
            }
            return LineAnswer(401, body)
        tier: Tier = "flex" if batch_id in self._escalated else "batch"
        window_s = self._expires.get(batch_id, time.time()) - time.time()
        return await self._lines.answer(line, caller, tier=tier, timeout_s=max(1.0, window_s))

    async def _finalize(self, record: BatchRecord, now: float) -> None:
        finalizing = msgspec.structs.replace(record, status="finalizing", finalizing_at=now)
        if await self._records.save_if(finalizing, "in_progress"):
            await self._finish(finalizing, "completed")

    async def _finish(self, record: BatchRecord, status: str) -> None:
        """Write the output and error files of what finished, and end the batch as `status`."""
        lines = self._inputs.get(record.id) or (await self._read_input(record))[0]
        results = await self._records.finished_lines(record.id)
        ordered = [results[line.custom_id] for line in lines if line.custom_id in results]
        outputs = [result.line for result in ordered if result.ok]
        failures = [result.line for result in ordered if not result.ok]
        now = time.time()
        ended = msgspec.structs.replace(
            record,
            status=status,  # type: ignore[arg-type]
            total=len(lines),
            completed=len(outputs),
            failed=len(failures),
            output_file_id=await self._write(record, "output", outputs),
            error_file_id=await self._write(record, "error", failures),
            **{f"{status}_at": now},
        )
        # Only over the status it was ended from: a cancel that came meanwhile (while an expiry was
        # being written, say) stands, and the next pass ends the batch as cancelled.
        if not await self._records.save_if(ended, record.status):
            await self._drop_files(ended.output_file_id, ended.error_file_id)
            return
        self._forget(record.id)
        logger.info("batch ended", extra={"batch_id": record.id, "status": status, "lines": len(lines)})

    def _forget(self, batch_id: str) -> None:
        """Drop what this runner kept of an ended batch; lines still running (an expired batch's) stop."""
        self._inputs.pop(batch_id, None)
        self._finished.pop(batch_id, None)
        self._callers.pop(batch_id, None)
        self._escalated.discard(batch_id)
        self._expires.pop(batch_id, None)
        self._stopping.discard(batch_id)
        self._running.pop(batch_id, None)
        for task in self._line_tasks.pop(batch_id, set()):
            task.cancel()
        self._retry_at = {key: at for key, at in self._retry_at.items() if key[0] != batch_id}

    async def _drop_files(self, *file_ids: str | None) -> None:
        """Delete files written for an end that did not stand."""
        for file_id in file_ids:
            file = await self._files.record(file_id) if file_id is not None else None
            if file is not None:
                await self._files.delete(file)

    async def _write(self, record: BatchRecord, kind: str, lines: Iterable[bytes]) -> str | None:
        """A file of `lines` for the batch's owner (None when there are none)."""
        written = list(lines)
        if not written:
            return None
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as out:
            for line in written:
                out.write(line + b"\n")
        path = Path(out.name)
        try:
            kept = await self._files.keep(
                owner=record.owner, filename=f"{record.id}_{kind}.jsonl", path=path, purpose="batch_output"
            )
        finally:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        return kept.id


def _result(line: BatchLine, answer: LineAnswer) -> LineResult:
    request_id = f"req_{secrets.token_hex(12)}"
    if answer.ok:
        shaped = line_output(line.custom_id, request_id, answer.status_code, answer.body)
    else:
        shaped = line_error(line.custom_id, request_id, answer.status_code, answer.body)
    return LineResult(ok=answer.ok, line=json.dumps(shaped, separators=(",", ":")).encode())


def _line_caller(caller: Caller | None) -> Caller | None:
    """The caller a batch's lines run as: its key, less the bounds on what a client sends at once
    (requests per minute and in flight), which the runner's own bounds stand for."""
    return None if caller is None else dataclasses.replace(caller, rpm=None, max_parallel=None)


def _progress(record: BatchRecord, finished: set[str], total: int) -> Progress:
    return Progress(
        total=total,
        finished=len(finished),
        started_at=record.in_progress_at or record.created_at,
        expires_at=record.expires_at,
    )


class _NamedModel(msgspec.Struct):
    model: str = ""


_model_decoder = msgspec.json.Decoder(_NamedModel)


def _models_of(lines: list[BatchLine]) -> set[str]:
    """The models a batch's lines name (checked on upload)."""
    models = set()
    for line in lines:
        try:
            models.add(_model_decoder.decode(line.body).model)
        except msgspec.DecodeError:
            continue
    return models - {""}
