"""The long-lived heap frozen out of full collections: what is frozen, what is still collected, and
the pauses measured. Each case runs in a child interpreter: freezing the test process's own heap
would keep its garbage for the rest of the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families


def run_child(code: str) -> dict[str, object]:
    """Run `code` in a fresh interpreter; what it printed last, as JSON."""
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_freezing_keeps_live_start_up_objects_out_of_full_collections_but_not_start_up_garbage() -> None:
    result = run_child(
        """
        import gc, json, weakref
        from switchboard import gc_heap

        class Node:
            pass

        kept = [Node() for _ in range(20_000)]  # start-up state: lives on
        garbage = Node(); garbage.me = garbage  # a cycle nobody holds, made at start-up
        collected_before = []
        weakref.finalize(garbage, collected_before.append, True)
        del garbage
        before = len(gc.get_objects())
        frozen = gc_heap.freeze_long_lived()
        print(json.dumps({
            "before": before, "frozen": frozen, "tracked_after": len(gc.get_objects()),
            "start_up_garbage_collected": collected_before == [True],
        }))
        """
    )
    assert result["start_up_garbage_collected"], "a cycle made before the freeze is collected, not frozen"
    assert isinstance(result["frozen"], int) and result["frozen"] >= 20_000
    assert isinstance(result["tracked_after"], int) and result["tracked_after"] < 1_000


def test_garbage_made_after_the_freeze_is_collected_and_collect_all_reaches_frozen_objects() -> None:
    result = run_child(
        """
        import gc, json, weakref
        from switchboard import gc_heap

        class Engine:
            pass

        freed = []
        engine = Engine(); engine.me = engine  # an engine's objects: loaded before the freeze
        weakref.finalize(engine, freed.append, "engine")
        gc_heap.freeze_long_lived()
        later = Engine(); later.me = later  # a request's objects, after it
        weakref.finalize(later, freed.append, "later")
        del later
        gc.collect()
        after_plain = list(freed)
        del engine  # the engine is unloaded: a plain collection cannot reach it, frozen
        gc.collect()
        after_unload_plain = list(freed)
        gc_heap.collect_all()
        print(json.dumps({
            "after_plain": after_plain, "after_unload_plain": after_unload_plain,
            "after_collect_all": freed, "frozen_again": gc.get_freeze_count() > 0,
        }))
        """
    )
    assert result["after_plain"] == ["later"]
    assert result["after_unload_plain"] == ["later"], "a frozen cycle is out of a plain collection's reach"
    assert result["after_collect_all"] == ["later", "engine"]
    assert result["frozen_again"], "what survives is frozen again"


def test_what_a_load_made_is_frozen_after_it_only_where_the_process_froze_its_heap() -> None:
    result = run_child(
        """
        import gc, json, weakref
        from switchboard import gc_heap

        gc_heap.freeze_new()  # a process that never froze its heap (a test's): nothing happens
        untouched = gc.get_freeze_count()
        gc_heap.freeze_long_lived()
        at_start = gc.get_freeze_count()
        model = [[index] for index in range(10_000)]  # a model's objects, loaded later
        freed = []
        class Junk:
            pass

        junk = Junk(); junk.me = junk  # the load's garbage: collected, never frozen
        weakref.finalize(junk, freed.append, True)
        del junk
        gc_heap.freeze_new()
        print(json.dumps({
            "untouched": untouched, "added": gc.get_freeze_count() - at_start, "garbage_freed": freed,
        }))
        """
    )
    assert result["untouched"] == 0
    assert isinstance(result["added"], int) and result["added"] >= 10_000
    assert result["garbage_freed"] == [True]


def test_pauses_are_measured_by_generation_and_the_frozen_count_exported() -> None:
    result = run_child(
        """
        import gc, json
        from prometheus_client import generate_latest
        from switchboard import gc_heap
        from switchboard.metrics import REGISTRY

        def full_pauses():
            name = "switchboard:gc_pause_seconds_count"
            return REGISTRY.get_sample_value(name, {"generation": "2"}) or 0.0

        gc_heap.observe_pauses()
        gc_heap.observe_pauses()  # twice: still one observer
        gc_heap.freeze_long_lived()
        before = full_pauses()
        gc.collect(2)
        print(json.dumps({
            "one_full_collection": full_pauses() - before,
            "text": generate_latest(REGISTRY).decode(),
            "frozen": gc.get_freeze_count(),
        }))
        """
    )
    assert result["one_full_collection"] == 1, "each collection is observed once"
    families = {family.name: family for family in text_string_to_metric_families(str(result["text"]))}
    pauses = families["switchboard:gc_pause_seconds"].samples
    assert {sample.labels["generation"] for sample in pauses if sample.name.endswith("_count")} >= {"2"}
    assert all(sample.value < 1.0 for sample in pauses if sample.name.endswith("_sum")), pauses
    (frozen,) = families["switchboard:gc_frozen_objects"].samples
    assert frozen.value == result["frozen"]
    assert frozen.value > 0


def test_a_scrape_does_not_count_the_frozen_heap_again() -> None:
    """Counting walks every frozen object with the GIL held: it happens when gc_heap freezes the
    heap, not at each scrape of the metrics (a scrape reads the count of the last freeze)."""
    result = run_child(
        """
        import gc, json
        from prometheus_client import generate_latest
        from switchboard import gc_heap
        from switchboard.metrics import REGISTRY

        def frozen_gauge():
            generate_latest(REGISTRY)  # a scrape
            return REGISTRY.get_sample_value("switchboard:gc_frozen_objects")

        model = [[index] for index in range(5_000)]
        gc_heap.freeze_long_lived()
        at_freeze = gc.get_freeze_count()
        more = [[index] for index in range(5_000)]
        gc.freeze()  # frozen behind gc_heap's back: no scrape may count it
        scraped = frozen_gauge()
        gc_heap.freeze_new()
        after_new = frozen_gauge()
        real_after_new = gc.get_freeze_count()
        del model, more
        gc_heap.collect_all()
        print(json.dumps({
            "at_freeze": at_freeze, "scraped": scraped, "after_new": after_new,
            "real_after_new": real_after_new, "after_collect_all": frozen_gauge(),
            "real_after_collect_all": gc.get_freeze_count(),
        }))
        """
    )
    assert result["scraped"] == result["at_freeze"]
    assert result["after_new"] == result["real_after_new"]
    at_freeze, real_after_new = result["at_freeze"], result["real_after_new"]
    assert isinstance(at_freeze, int) and isinstance(real_after_new, int)
    assert real_after_new >= at_freeze + 5_000
    assert result["after_collect_all"] == result["real_after_collect_all"]
