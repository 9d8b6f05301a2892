"""The names a client may call that lead to other names — routes to their targets, pipelines to
their steps — and the one thing such a graph must not have: a loop, which would send a request
round for ever. Checked at start and on every change through the admin API."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class LoopError(ValueError):
    """Names that lead back to themselves; the message gives the path of the loop."""


def find_loop(leads_to: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A path from a name back to itself (its first and last names the same), or None.

    `leads_to` maps each name to the names it may send a request to; names it does not map lead
    nowhere (models). Depth-first, in the mapping's order, so the same config gives the same path."""
    done: set[str] = set()
    for start in leads_to:
        path = _loop_from(start, leads_to, [], set(), done)
        if path is not None:
            return path
    return None


def _loop_from(
    name: str, leads_to: Mapping[str, Iterable[str]], path: list[str], on_path: set[str], done: set[str]
) -> list[str] | None:
    if name in on_path:
        return [*path[path.index(name) :], name]
    if name in done:
        return None
    path.append(name)
    on_path.add(name)
    for following in leads_to.get(name, ()):
        loop = _loop_from(following, leads_to, path, on_path, done)
        if loop is not None:
            return loop
    path.pop()
    on_path.discard(name)
    done.add(name)
    return None


def check_no_loop(leads_to: Mapping[str, Iterable[str]]) -> None:
    """LoopError naming the path of the first loop, if there is one."""
    loop = find_loop(leads_to)
    if loop is not None:
        raise LoopError(
            f"routes and pipelines lead in a loop: {' -> '.join(loop)}; a request would go round for ever"
        )
