"""A stand-in for `switchboard worker|router` in the launcher's tests: no Triton, no engine, no Redis.

It takes the command line the launcher gives `switchboard` and behaves as environment variables say:

- FAKE_EVENTS: a file where each component appends `<name> <event>` lines (started, running once
  a worker handles SIGTERM, stopped, ...);
- FAKE_WORKER_EXIT: a worker exits with this code at once;
- FAKE_WORKER_EXIT_AFTER_READY: a worker exits with this code once the router has said it is ready;
- FAKE_IGNORE_TERM: a worker ignores SIGTERM (the launcher has to kill it);
- FAKE_GRANDCHILD: a worker starts a long `sleep` in its process group and logs its pid;
- FAKE_NOT_READY_TIMES: `/readyz` answers 503 (no live worker) this many times before 200;
- FAKE_PREPARING_S: then `/readyz` answers 503 (engines preparing) until this many seconds after
  the front door started;
- FAKE_SECOND_WORKER_PREPARING_S: then `/readyz` is ready but counts one prepared worker of two
  until this many seconds after the front door started;
- REDIS_URL_FILE (as the launcher passes it): a worker pings that Redis, as the real one would
  connect, and logs `redis answered`; it pings it again while it stops, as the real one withdraws
  its record then (after FAKE_STOP_DELAY_S, as long as the real one's other stop steps), and logs
  `redis answered on stop` (or `redis gone on stop: ...`);
- FAKE_CHAT_FAILURES: `/v1/chat/completions` answers 503 this many times before 200 (404 for model
  "unknown").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ARGS = sys.argv[1:]
ROLE = "router" if "router" in ARGS else "worker"
NAME = os.environ.get("SWITCHBOARD_LOG_LABEL", ROLE)
EVENTS = Path(os.environ["FAKE_EVENTS"])


def event(text: str) -> None:
    with EVENTS.open("a") as events:
        events.write(f"{NAME} {text}\n")


def log(text: str) -> None:
    if "--log-file" in ARGS:
        with open(ARGS[ARGS.index("--log-file") + 1], "a") as log_file:
            log_file.write(text + "\n")


def stop(*_: object) -> None:
    event("stopped")
    sys.exit(0)


def stop_worker(*_: object) -> None:
    # A real worker drains and unloads before it withdraws its record from Redis.
    time.sleep(float(os.environ.get("FAKE_STOP_DELAY_S", "0")))
    if os.environ.get("REDIS_URL_FILE"):
        try:
            ping_redis()
            event("redis answered on stop")
        except Exception as exc:
            event(f"redis gone on stop: {exc!r}")
    stop()


def run_worker() -> None:
    if "FAKE_WORKER_EXIT" in os.environ:
        log("worker: giving up at once")
        sys.exit(int(os.environ["FAKE_WORKER_EXIT"]))
    if os.environ.get("REDIS_URL_FILE"):
        ping_redis()
        event("redis answered")
    if os.environ.get("FAKE_GRANDCHILD"):
        sleeper = subprocess.Popen(["sleep", "600"])
        event(f"grandchild {sleeper.pid}")
    ignore = bool(os.environ.get("FAKE_IGNORE_TERM"))
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else stop_worker)
    event("running")  # from here on, SIGTERM is handled
    exit_after_ready = os.environ.get("FAKE_WORKER_EXIT_AFTER_READY")
    while True:
        if exit_after_ready and "router ready" in EVENTS.read_text():
            sys.exit(int(exit_after_ready))
        time.sleep(0.05)


def ping_redis() -> None:
    import redis

    from switchboard.config import load_settings

    url = load_settings(None).redis.url
    assert url is not None
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        client.ping()


class Handler(BaseHTTPRequestHandler):
    not_ready_left = int(os.environ.get("FAKE_NOT_READY_TIMES", "0"))
    preparing_until = time.monotonic() + float(os.environ.get("FAKE_PREPARING_S", "0"))
    chat_failures_left = int(os.environ.get("FAKE_CHAT_FAILURES", "0"))
    second_preparing = os.environ.get("FAKE_SECOND_WORKER_PREPARING_S")
    second_prepared_at = time.monotonic() + float(second_preparing or 0)

    def do_GET(self) -> None:
        if self.path != "/readyz":
            return self.answer(404, {"error": {"message": "no such path"}})
        if Handler.not_ready_left > 0:
            Handler.not_ready_left -= 1
            return self.answer(503, {"error": {"message": "no worker", "code": "no_live_worker"}})
        if time.monotonic() < Handler.preparing_until:
            return self.answer(503, {"error": {"message": "preparing", "code": "engines_preparing"}})
        if Handler.second_preparing is None:
            event("ready")
            return self.answer(200, {"status": "ready", "workers": 1})
        prepared = 2 if time.monotonic() >= Handler.second_prepared_at else 1
        event(f"ready with {prepared} prepared")
        return self.answer(200, {"status": "ready", "workers": 2, "workers_prepared": prepared})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] == "unknown":
            return self.answer(404, {"error": {"message": "The model `unknown` does not exist."}})
        if Handler.chat_failures_left > 0:
            Handler.chat_failures_left -= 1
            return self.answer(503, {"error": {"message": "loading"}})
        event(f"answered {body['model']}")
        return self.answer(200, {"object": "chat.completion"})

    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


def run_router() -> None:
    signal.signal(signal.SIGTERM, stop)
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["SWITCHBOARD_ROUTER__PORT"])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    event("started")
    log(f"{NAME} argv={ARGS} redis={os.environ.get('REDIS_URL')}")
    print(f"{NAME} says hello on its terminal, argv={ARGS}", file=sys.stderr, flush=True)
    run_router() if ROLE == "router" else run_worker()
