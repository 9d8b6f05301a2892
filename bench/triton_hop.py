"""What the hop through the worker's Triton costs: the same jobs, through Triton and straight into the model.

Both sides run the product's own Triton model (`workers.triton.generator.model.GeneratorModel`, coalescer and
output stream included) over a scripted engine that streams `--tokens` tokens at a fixed pace, so
the engine costs nearly nothing and what differs is the hop alone:

- **Triton**: a real `TritonHost` (tritonserver with the worker's own backend, the engine's loop) and the
  consumer's `TritonJobClient` (one gRPC stream per model, the model's output stream); the same with
  the model on Triton's Python backend (its stub process between Triton and the engine's loop, as
  where the worker's own backend is not built; `--no-python-stub` leaves it out);
- **direct**: the same callable called on the benchmark's event loop (what `bench/scale_sim.py` puts in
  place of Triton).

Per level it prints time to the first chunk and to the end (one stream: a one-token job; more streams:
closed loops of `--tokens`-token jobs; `--idle-ms` sleeps before each one-stream job), and the CPU of this process and its children (tritonserver,
the stub) per job and per chunk, with the ratio Triton / direct. Run: `.venv/bin/python bench/triton_hop.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from tables import fmt, print_aligned

from switchboard.config import ModelConfig, triton_model_name
from switchboard.wire import Job, SamplingParams, chunk_decoder, encode
from workers.engines.base import Delta, Engine, EngineRequest, Footprint
from workers.triton.generator.client import TritonJobClient
from workers.triton.generator.model import CoalescingPolicy, GeneratorModel
from workers.triton.host import TritonHost

MODEL = "hop"
WARMUP_JOBS = 30
# The worker's default coalescing (switchboard.config.WorkerConfig).
DEFAULT_POLICY = CoalescingPolicy(min_window_s=0.015, max_window_s=0.2, max_chunks_per_s=200.0)


class PacedEngine(Engine):
    """Streams `max_tokens` tokens, one per `token_s`."""

    def __init__(self, token_s: float) -> None:
        super().__init__(ModelConfig(name=MODEL, path="unused"))
        self._token_s = token_s

    async def start(self) -> None:
        return None

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        count = request.sampling.max_tokens or 1
        for index in range(count):
            if count > 1:
                await asyncio.sleep(self._token_s)
            last = index == count - 1
            yield Delta(
                text=f"t{index} ",
                prompt_tokens=3,
                completion_tokens=index + 1,
                finish_reason="length" if last else None,
                last=last,
            )

    async def abort(self, request_id: str) -> None:
        return None

    async def stop(self) -> None:
        return None

    def footprint(self) -> Footprint:
        return Footprint(device="cpu", memory_bytes=0)


def job_payload(tokens: int) -> bytes:
    now = time.time()
    job = Job(
        id=uuid.uuid4().hex,
        model=MODEL,
        prompts=("hello",),
        sampling=SamplingParams(max_tokens=tokens),
        created=now,
        deadline=now + 60,
    )
    return encode(job)


Stream = Callable[[bytes], AsyncIterator[bytes]]


def direct_stream(callable_: GeneratorModel) -> Stream:
    async def stream(payload: bytes) -> AsyncIterator[bytes]:
        async for response in callable_.serve(payload, stream=0, tag=None):
            yield response

    return stream


@dataclass
class Level:
    side: str
    streams: int
    jobs: int
    chunks: int
    first_ms_p50: float
    end_ms_p50: float
    cpu_ms_per_job: float
    cpu_us_per_chunk: float


def cpu_s() -> float:
    """CPU of this process and its descendants (tritonserver, the stub) so far."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


async def one_job(stream: Stream, tokens: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = None
    chunks = 0
    async for raw in stream(job_payload(tokens)):
        chunk_decoder.decode(raw)
        first = first or time.perf_counter()
        chunks += 1
    ended = time.perf_counter()
    assert first is not None, "a job without a chunk"
    return (first - started) * 1e3, (ended - started) * 1e3, chunks


async def level(
    side: str, stream: Stream, streams: int, jobs: int, tokens: int, idle_s: float = 0.0
) -> Level:
    """`jobs` jobs, `streams` at a time; each first waits `idle_s`, with nothing else to do, as the
    worker waits between one stream's requests."""
    for _ in range(WARMUP_JOBS):
        await one_job(stream, 1)
    slots = asyncio.Semaphore(streams)

    async def limited() -> tuple[float, float, int]:
        async with slots:
            if idle_s:
                await asyncio.sleep(idle_s)
            return await one_job(stream, tokens)

    before = cpu_s()
    results = await asyncio.gather(*(limited() for _ in range(jobs)))
    spent_ms = (cpu_s() - before) * 1e3
    chunks = sum(r[2] for r in results)
    return Level(
        side=side,
        streams=streams,
        jobs=jobs,
        chunks=chunks,
        first_ms_p50=statistics.median(r[0] for r in results),
        end_ms_p50=statistics.median(r[1] for r in results),
        cpu_ms_per_job=spent_ms / jobs,
        cpu_us_per_chunk=spent_ms * 1e3 / chunks,
    )


async def run_levels(side: str, stream: Stream, args: argparse.Namespace) -> list[Level]:
    measured = [await level(side, stream, 1, args.single_jobs, 1, args.idle_ms / 1000)]
    for streams in args.streams:
        print(f"  {side}: {streams} streams ...", file=sys.stderr, flush=True)
        measured.append(await level(side, stream, streams, streams * args.jobs_per_stream, args.tokens))
    return measured


async def through_triton(
    args: argparse.Namespace, policy: CoalescingPolicy, *, chunks_in_process: bool, native: bool = True
) -> list[Level]:
    """Jobs through a real Triton host; their chunks handed over in this process (as the worker
    does), or back through Triton as responses of the model's output stream request. The model on the
    worker's own Triton backend, or (`native` False) on Triton's Python backend with its stub."""
    side = "Triton" if chunks_in_process else "Triton, chunks as responses"
    if not native:
        side += ", Python stub"
    host = TritonHost(coalescing=policy, native=native)
    print(f"starting Triton ({side}) ...", file=sys.stderr, flush=True)
    await asyncio.to_thread(host.start)
    try:
        callable_ = await asyncio.to_thread(host.bind, MODEL, PacedEngine(args.token_s))
        assert isinstance(callable_, GeneratorModel)
        local = callable_ if chunks_in_process else None
        client = TritonJobClient(host.grpc_address, triton_model_name(MODEL), local=local)
        try:
            return await run_levels(side, client.stream, args)
        finally:
            await client.close()
            await callable_.stop_engine()
            await asyncio.to_thread(host.unbind, MODEL)
    finally:
        await asyncio.to_thread(host.stop)


async def direct(args: argparse.Namespace, policy: CoalescingPolicy) -> list[Level]:
    callable_ = GeneratorModel(PacedEngine(args.token_s), policy)
    callable_.attach_loop(asyncio.get_running_loop())
    return await run_levels("direct", direct_stream(callable_), args)


def table(sides: list[list[Level]], direct_side: list[Level]) -> list[list[str]]:
    """Each level's rows, one per side, then each Triton side's ratio to the direct side."""
    lines = [
        ["streams", "side", "first chunk p50 ms", "end p50 ms", "CPU ms/job", "CPU µs/chunk", "chunks/job"]
    ]
    for index, base in enumerate(direct_side):
        rows = [side[index] for side in sides]
        for row in [*rows, base]:
            lines.append(
                [
                    str(row.streams),
                    row.side,
                    fmt(row.first_ms_p50, 2),
                    fmt(row.end_ms_p50, 2),
                    fmt(row.cpu_ms_per_job, 2),
                    fmt(row.cpu_us_per_chunk, 0),
                    fmt(row.chunks / row.jobs, 1),
                ]
            )
        for hop in rows:
            lines.append(
                [
                    str(hop.streams),
                    f"{hop.side} / direct",
                    fmt(hop.first_ms_p50 / base.first_ms_p50, 2) + "x",
                    fmt(hop.end_ms_p50 / base.end_ms_p50, 2) + "x",
                    fmt(hop.cpu_ms_per_job / base.cpu_ms_per_job, 2) + "x",
                    fmt(hop.cpu_us_per_chunk / base.cpu_us_per_chunk, 2) + "x",
                    "",
                ]
            )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="8,32,64", help="concurrent streams of the loaded levels")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per job at the loaded levels")
    parser.add_argument("--token-s", type=float, default=0.01, help="pause before each token, in s")
    parser.add_argument("--jobs-per-stream", type=int, default=6, help="jobs per stream at each loaded level")
    parser.add_argument("--single-jobs", type=int, default=300, help="one-token jobs at one stream")
    parser.add_argument(
        "--idle-ms",
        type=float,
        default=0.0,
        help="sleep before each one-stream job, in ms: the hop's cost after its processes slept (default 0)",
    )
    parser.add_argument(
        "--no-python-stub",
        action="store_true",
        help="leave out the side with the model on Triton's Python backend (its stub) instead of the worker's own",
    )
    parser.add_argument("--output", type=Path, help="JSON results file")
    args = parser.parse_args()
    args.streams = [int(n) for n in args.streams.split(",")]
    return args


async def main() -> None:
    args = parse_args()
    sides = [await through_triton(args, DEFAULT_POLICY, chunks_in_process=True)]
    if not args.no_python_stub:
        sides.append(await through_triton(args, DEFAULT_POLICY, chunks_in_process=True, native=False))
    sides.append(await through_triton(args, DEFAULT_POLICY, chunks_in_process=False))
    inline = await direct(args, DEFAULT_POLICY)
    print_aligned(table(sides, inline))
    if args.output is not None:
        rows = [row for side in sides for row in side] + inline
        args.output.write_text(json.dumps([asdict(row) for row in rows], indent=2))


if __name__ == "__main__":
    asyncio.run(main())
