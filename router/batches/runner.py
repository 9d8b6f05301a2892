"""The batch runner: one front door at a time works through the batches not yet ended.

The front door holding the runner's lease (a Redis key it renews) takes each active batch through
OpenAI's states: `validating` (its input file read from the store, every line's URL the batch's
endpoint) → `in_progress` (its lines run a few at a time, `LineRunner`, each finished line written
to the batch's results at once) → `finalizing` (the output and error files written, in the input's
order) → `completed`; or `failed` (a file that cannot run), `expired` (its 24-hour window passed
first) or, once cancelled, `cancelling` → `cancelled` (the lines running end, the rest never start,
and what finished is in the files). A front door that dies loses the lease; another takes it within
LEASE_S and goes on from the results: a line that was running when it died runs again, once.

Lines run beside interactive requests through the same queue, at most MAX_LINES_IN_FLIGHT at once
over every batch, so that a batch does not crowd the live traffic out. (They are not yet a tier of
their own below interactive jobs in the workers' slots.)
"""

from __future__ import annotations

import asyncio
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
from router.batches.lines import BatchLine, LineAnswer, LineRunner
from router.batches.records import BatchRecord, BatchRecords, LineResult
from router.files.service import FileService
from router.openai.batches import BatchError, line_error, line_output
from switchboard import keys
from switchboard.tasks import TaskSet, poll

logger = logging.getLogger(__name__)

LEASE_S = 15.0
# A pass every half second while batches run; every IDLE_PASS_S while none does (an idle pass is
# one Redis command).
PASS_EVERY_S = 0.5
IDLE_PASS_S = 2.0
# Lines of all batches running at once on the runner's front door.
MAX_LINES_IN_FLIGHT = 8
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
    ) -> None:
        self._redis = redis
        self._records = records
        self._files = files
        self._lines = lines
        self._caller_of = caller_of
        self._router_id = router_id
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
        self._callers[record.id] = self._caller_of(record.owner)
        self._start_lines(record.id, now)

    def _start_lines(self, batch_id: str, now: float) -> None:
        """Start the batch's next lines, up to MAX_LINES_IN_FLIGHT over all batches: at each pass, and
        as each line ends (so a batch of fast lines is not paced by the passes)."""
        lines, finished = self._inputs.get(batch_id), self._finished.get(batch_id)
        running = self._running.get(batch_id)
        if lines is None or finished is None or running is None:  # ended, or no longer this runner's
            return
        for line in lines:
            if self._lines_in_flight() >= MAX_LINES_IN_FLIGHT:
                break
            if line.custom_id in finished or line.custom_id in running:
                continue
            if self._retry_at.get((batch_id, line.custom_id), 0.0) > now:
                continue
            running.add(line.custom_id)
            self._start(batch_id, line, self._callers.get(batch_id))

    def _lines_in_flight(self) -> int:
        return sum(len(running) for running in self._running.values())

    def _start(self, batch_id: str, line: BatchLine, caller: Caller | None) -> None:
        task = asyncio.create_task(self._run_line(batch_id, line, caller))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        batch_tasks = self._line_tasks.setdefault(batch_id, set())
        batch_tasks.add(task)
        task.add_done_callback(batch_tasks.discard)

    async def _run_line(self, batch_id: str, line: BatchLine, caller: Caller | None) -> None:
        try:
            answer = await self._answer(line, caller)
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

    async def _answer(self, line: BatchLine, caller: Caller | None) -> LineAnswer:
        if caller is None:
            body = {
                "error": {
                    "message": "The API key that created this batch was removed.",
                    "type": "invalid_request_error",
                }
            }
            return LineAnswer(401, body)
        return await self._lines.answer(line, caller)

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
        await self._records.save(ended)
        self._forget(record.id)
        logger.info("batch ended", extra={"batch_id": record.id, "status": status, "lines": len(lines)})

    def _forget(self, batch_id: str) -> None:
        """Drop what this runner kept of an ended batch; lines still running (an expired batch's) stop."""
        self._inputs.pop(batch_id, None)
        self._finished.pop(batch_id, None)
        self._callers.pop(batch_id, None)
        self._stopping.discard(batch_id)
        self._running.pop(batch_id, None)
        for task in self._line_tasks.pop(batch_id, set()):
            task.cancel()
        self._retry_at = {key: at for key, at in self._retry_at.items() if key[0] != batch_id}

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
