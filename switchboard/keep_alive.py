"""The keep-alive ladder: how long an idle model stays on each rung (warm → asleep → cold).

One rule, read by the controller's policy (is a model idle long enough to move down?), by the
worker's heartbeat (when will it move down?) and by the status page (does it never move down?).
Times count from the end of the model's last job: a model asleep leaves after `keep_alive_s +
asleep_keep_alive_s` idle seconds. A setting of -1 means never.
"""

from __future__ import annotations

from switchboard.wire import SlotState


def idle_limit_s(state: SlotState, keep_alive_s: float, asleep_keep_alive_s: float) -> float | None:
    """Idle seconds after which keep-alive moves a model in `state` down one rung; None: never.

    A `keep_alive_s` of -1 stops the whole ladder; an `asleep_keep_alive_s` of -1 only its second rung.
    """
    if keep_alive_s < 0:
        return None
    if state == "warm":
        return keep_alive_s
    if state == "sleeping" and asleep_keep_alive_s >= 0:
        return keep_alive_s + asleep_keep_alive_s
    return None


def leaves_at(
    state: SlotState,
    idle_since: float | None,
    *,
    keep_alive_s: float,
    asleep_keep_alive_s: float,
    in_flight: int,
    min_replicas: int,
) -> float | None:
    """When keep-alive will move a replica down, if nothing uses it meanwhile.

    None while it runs jobs, before its idle time is known, for a model with `min_replicas` (its
    holders may be its minimum set), or when its rung is held for good.
    """
    if in_flight or idle_since is None or min_replicas > 0:
        return None
    limit_s = idle_limit_s(state, keep_alive_s, asleep_keep_alive_s)
    return None if limit_s is None else idle_since + limit_s


def never_leaves(
    state: SlotState, *, keep_alive_s: float, asleep_keep_alive_s: float, min_replicas: int
) -> bool:
    """Whether the status page shows a held model in `state` as staying for good.

    It reads the setting of the model's own rung only: a sleeping model whose `keep_alive_s` is -1
    (but whose `asleep_keep_alive_s` is not) is not shown as staying, though `idle_limit_s` never
    moves it.
    """
    return (
        min_replicas > 0
        or (state == "warm" and keep_alive_s < 0)
        or (state == "sleeping" and asleep_keep_alive_s < 0)
    )
