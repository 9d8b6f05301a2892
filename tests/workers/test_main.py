"""The worker's probes on its metrics port: alive while its loop answers, ready while it takes jobs."""

from __future__ import annotations

import httpx

from workers.runtime.metrics_server import MetricsServer


async def test_healthz_answers_and_readyz_follows_whether_the_worker_takes_jobs() -> None:
    taking_jobs = True
    server = MetricsServer("127.0.0.1", 0, lambda: None, ready=lambda: taking_jobs)
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
            taking_jobs = False  # draining, or its consumer stopped
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/nothing")).status_code == 404
    finally:
        await server.stop()
