"""The thread whose event loop drives one generator's engine.

vLLM's engine client keeps its output task on the loop its first request ran on, so every call into
the engine (a job, an abort, sleep and wake, the stop) runs on one loop. That loop is not the
worker's own: the worker's loop reads Redis and writes results for every model, and a job's way into
the engine would wait behind that. Each generator's Triton requests arrive on its engine loop
(`workers.triton.generator.job_socket`).
"""

from __future__ import annotations

import asyncio
import threading

# How long stopping waits for the loop's thread to end.
JOIN_TIMEOUT_S = 10.0


class EngineThread:
    """An event loop running on a thread of its own until `stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel what still runs on the loop, stop it and wait for its thread (from any other thread)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._cancel_all)
        self._thread.join(JOIN_TIMEOUT_S)

    def _cancel_all(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        # The tasks' cancellations run in the loop's next turns; stop once they have.
        self.loop.call_soon(lambda: self.loop.call_soon(self.loop.stop))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
