"""How one read shares a worker's free job slots among its warm models (pure: no Redis, no clock).

`allot` says how many jobs the consumer may take from each warm model's stream on this read. What
it keeps, with fair shares on (`worker.fair_shares`, the default):

- **A reserve per warm model.** A model with no job running, and a model with no job known to be
  waiting that runs fewer than its share, is allotted one slot before anyone else is: a job of it
  that arrives finds a slot at once, and no other model's jobs can take the last free slots away.
- **Weighted shares of the rest, higher priority first.** The other free slots go one at a time
  to the models whose last read came back full (jobs may still wait: "hungry"), the highest
  `priority` first, and among equals to the one running fewest jobs for its `weight`; with no
  model hungry, to every warm model so.
- **No model takes what its engine cannot batch** (`room`: its `max_num_seqs` less what it runs):
  jobs beyond that stay in its stream, where another worker can take them.
- **Never more than the free slots**, and ties fall to a turn that moves on every read, so that the
  stream named first is not favoured.

Why a reserve and not a deficit round robin over the models with waiting jobs alone: a worker
learns that a model has jobs waiting only by reading its stream, and a read takes the jobs. Once a
flood holds every slot, a round robin over the models known to wait hands each freed slot back to
the flooder, and the quiet model's job waits for the flood's backlog, or at best for one of its
jobs to end (15 times its time alone on the issue's CPU measure). Measured with scripted engines on
8 slots (tests/workers/jobs/test_fair_shares.py's worker, a flood of 24 jobs of 1.5 s, eight quiet
jobs one after the other): with the reserve, the quiet jobs' first chunks came in 5 ms (p50) and
10 ms at most, as alone (6 ms); without it, 8 ms p50 but 4.9 s for the first, which waited for the
flood's backlog. The reserve costs the flooder one slot per quiet warm model (one in 64 by default).
The rest is shared on jobs running, not on jobs taken: a share of slots is what a model holds, it
needs no memory across reads (a restart or a job handed back cannot skew it), and models whose jobs
differ in length still hold slots in proportion to weight.

With fair shares off, free slots go round the warm models in turn, one at a time, up to each
engine's batch: one pool, as before, but the read still never takes more than it may.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDemand:
    """One warm model, as a read sees it."""

    name: str
    # Jobs of it running here now.
    running: int
    # Jobs its engine may still take (its batch limit less `running`; 0 when full).
    room: int
    weight: float = 1.0
    priority: int = 0
    # Its last read came back with as many jobs as it asked for: more may be waiting.
    hungry: bool = False


def allot(
    free: int, models: Sequence[ModelDemand], *, total: int, turn: int = 0, fair: bool = True
) -> dict[str, int]:
    """Jobs each model may take on this read (only models allotted one or more), in the order the
    streams are to be read; the sum is at most `free`. `total` is the worker's slot count, `turn`
    the read's number (it rotates ties)."""
    if free <= 0 or not models:
        return {}
    order = _rotated(models, turn)
    if not fair:
        return _round_robin(free, order)
    allotted = dict.fromkeys((model.name for model in order), 0)
    left = _reserve(free, order, allotted, total)
    hungry = [model for model in order if model.hungry]
    if not hungry:
        left = _read_every_model(left, order, allotted)
    _fill(left, hungry or order, allotted)
    ranked = sorted(order, key=lambda model: (-model.priority, _load(model, allotted[model.name])))
    return {model.name: allotted[model.name] for model in ranked if allotted[model.name] > 0}


def _rotated(models: Sequence[ModelDemand], turn: int) -> list[ModelDemand]:
    start = turn % len(models)
    return [*models[start:], *models[:start]]


def _round_robin(free: int, order: list[ModelDemand]) -> dict[str, int]:
    allotted = dict.fromkeys((model.name for model in order), 0)
    while free > 0:
        open_ = [model for model in order if allotted[model.name] < model.room]
        if not open_:
            break
        for model in open_[:free]:
            allotted[model.name] += 1
        free -= min(free, len(open_))
    return {name: count for name, count in allotted.items() if count > 0}


def _share(model: ModelDemand, models: Sequence[ModelDemand], total: int) -> float:
    """The slots the model's weight entitles it to among the warm models."""
    return total * model.weight / sum(other.weight for other in models)


def _reserve(free: int, order: list[ModelDemand], allotted: dict[str, int], total: int) -> int:
    """One slot for each model that needs its reserve, most urgent first; returns the slots left."""
    needing = [
        model
        for model in order
        if model.room > 0
        and (model.running == 0 or (not model.hungry and model.running < _share(model, order, total)))
    ]
    needing.sort(key=lambda model: (-model.priority, _load(model, 0)))
    for model in needing[:free]:
        allotted[model.name] = 1
    return free - min(free, len(needing))


def _read_every_model(free: int, order: list[ModelDemand], allotted: dict[str, int]) -> int:
    """With no model known to have jobs waiting, and slots left after the reserves: one for every
    model with room that has none yet (most urgent first), so that its stream is read and a job of
    it that arrives is taken at once.
    A model at or past its share with nothing known to wait has no reserve, and the rest of the free
    slots go to the others; left out of the read, a closed loop of its clients waited for the read's
    timeout on every request (its tokens/s 9-20 % below fair shares off at 32 clients, measured with
    bench/fair_share.py). Returns the slots left."""
    unread = [model for model in order if model.room > 0 and allotted[model.name] == 0]
    unread.sort(key=lambda model: (-model.priority, _load(model, 0)))
    for model in unread[:free]:
        allotted[model.name] = 1
    return free - min(free, len(unread))


def _fill(free: int, candidates: list[ModelDemand], allotted: dict[str, int]) -> None:
    """Give `free` slots one at a time: highest priority first, then fewest jobs for the weight."""
    heap = [
        (-model.priority, _load(model, allotted[model.name]), position, model)
        for position, model in enumerate(candidates)
        if allotted[model.name] < model.room
    ]
    heapq.heapify(heap)
    while free > 0 and heap:
        _, _, position, model = heapq.heappop(heap)
        allotted[model.name] += 1
        free -= 1
        if allotted[model.name] < model.room:
            heapq.heappush(heap, (-model.priority, _load(model, allotted[model.name]), position, model))


def _load(model: ModelDemand, allotted: int) -> float:
    """Jobs the model would run after this read, for its weight."""
    return (model.running + allotted) / model.weight
