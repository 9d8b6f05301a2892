"""Switchboard's path against vLLM's own server, level by level, from the same run's CPU readings.

Both systems run the same engine, so what differs is the path around it: for Switchboard the front
door, Redis, the worker, tritonserver and Triton's Python backend stub; for vLLM its API server. A
level's CPU is split into the engine's own processes (its core and, where the server runs the model
in a process of its own, its model runner) and the rest, the path, each per answered request, with
Switchboard's ratio to vLLM's. Chunks per request are shown beside them: vLLM's server sends a
chunk per token by default, Switchboard coalesces, so per request is the fair unit, not per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpu_accounting import per_request_ms
from path_cpu_report import NOT_THE_STACK, LevelCpu, cell

# The processes that compute the model, alike in both systems; everything else of a stack is its path.
ENGINE_KINDS = ("vLLM engine core", "vLLM model runner")


@dataclass
class Side:
    """One system at one level: CPU ms per answered request on its path and in its engine."""

    ttft_p50_ms: float | None
    chunks_per_request: float
    path_ms: float | None
    engine_ms: float | None

    @property
    def stack_ms(self) -> float | None:
        """Path and engine together."""
        if self.path_ms is None or self.engine_ms is None:
            return None
        return self.path_ms + self.engine_ms


@dataclass
class Compared:
    """Both systems at one concurrency level."""

    concurrency: int
    switchboard: Side
    vllm: Side

    def ratio(self, figure: str) -> float | None:
        """Switchboard's `figure` (a Side attribute) over vLLM's."""
        ours: float | None = getattr(self.switchboard, figure)
        theirs: float | None = getattr(self.vllm, figure)
        if ours is None or not theirs:
            return None
        return round(ours / theirs, 2)


def side(level: LevelCpu) -> Side:
    """A level's figures, its stack's CPU split into engine and path."""
    engine_s = path_s = 0.0
    for group in level.groups:
        if group.kind in NOT_THE_STACK:
            continue
        if group.kind in ENGINE_KINDS:
            engine_s += group.net_s
        else:
            path_s += group.net_s
    answered = max(level.load.requests - level.load.errors, 1)
    return Side(
        ttft_p50_ms=level.ttft_p50_ms,
        chunks_per_request=round(level.load.chunks / answered, 1),
        path_ms=per_request_ms(path_s, level.load),
        engine_ms=per_request_ms(engine_s, level.load),
    )


def compare(switchboard: list[LevelCpu], vllm: list[LevelCpu]) -> list[Compared]:
    """The levels both systems ran, in Switchboard's order."""
    theirs = {level.load.concurrency: level for level in vllm}
    return [
        Compared(level.load.concurrency, side(level), side(theirs[level.load.concurrency]))
        for level in switchboard
        if level.load.concurrency in theirs
    ]


def comparison_markdown(rows: list[Compared]) -> str:
    """The side-by-side table: each figure as Switchboard / vLLM, ratios where they say something."""
    head = (
        "| streams | TTFT p50 ms SB / vLLM | ratio | chunks per request SB / vLLM "
        "| path CPU ms/request SB / vLLM | ratio | engine CPU ms/request SB / vLLM "
        "| stack CPU ms/request SB / vLLM | ratio |"
    )
    lines = [head, "|---:|---|---:|---|---|---:|---|---|---:|"]
    for row in rows:
        ours, theirs = row.switchboard, row.vllm
        lines.append(
            f"| {row.concurrency} "
            f"| {cell(ours.ttft_p50_ms, 1)} / {cell(theirs.ttft_p50_ms, 1)} | {cell(row.ratio('ttft_p50_ms'), 2)} "
            f"| {ours.chunks_per_request:.1f} / {theirs.chunks_per_request:.1f} "
            f"| {cell(ours.path_ms, 2)} / {cell(theirs.path_ms, 2)} | {cell(row.ratio('path_ms'), 2)} "
            f"| {cell(ours.engine_ms, 2)} / {cell(theirs.engine_ms, 2)} "
            f"| {cell(ours.stack_ms, 2)} / {cell(theirs.stack_ms, 2)} | {cell(row.ratio('stack_ms'), 2)} |"
        )
    return "\n".join(lines) + "\n"


def comparison_json(rows: list[Compared]) -> list[dict[str, object]]:
    """The table's figures for the results file."""
    return [
        {
            "concurrency": row.concurrency,
            "switchboard": {**row.switchboard.__dict__, "stack_ms": row.switchboard.stack_ms},
            "vllm": {**row.vllm.__dict__, "stack_ms": row.vllm.stack_ms},
            "ratios": {figure: row.ratio(figure) for figure in ("ttft_p50_ms", "path_ms", "stack_ms")},
        }
        for row in rows
    ]
