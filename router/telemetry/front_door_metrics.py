"""The front door's Prometheus metrics (served by `router.endpoints.metrics`).

Requests are counted by model (the one that served), the route the request named (empty for none)
and HTTP status, and timed from the moment the request arrived: to
the first result chunk (time to first token), to the last byte (end to end), and per output token
between the two. The queue's depth and the age of its oldest job are read from Redis when scraped
(`router.status.model_status.queue_depths`), so every front door reports the same queues.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from switchboard.metrics import REGISTRY, REQUEST_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

REQUESTS = Counter(
    "switchboard:requests",
    "Requests answered by the front door, by model, the route it came through and HTTP status (model "
    "is empty when unknown; route when the request named none).",
    ["model", "route", "status"],
    registry=REGISTRY,
)
OPERATION_REQUESTS = Counter(
    "switchboard:operation_requests",
    "Requests by the GenAI operation they asked for (chat, text_completion, embeddings, classify, "
    "rerank), model (empty when unknown) and HTTP status.",
    ["operation", "model", "status"],
    registry=REGISTRY,
)
REQUEST_SUCCESS = Counter(
    "switchboard:request_success",
    "Choices that finished, by model, route and finish reason (as vllm:request_success_total).",
    ["model", "route", "finished_reason"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "switchboard:time_to_first_token_seconds",
    "From the request's arrival to its first result chunk at the front door.",
    ["model", "route"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "switchboard:time_per_output_token_seconds",
    "A request's time per output token after its first: (last chunk - first chunk) / (tokens - 1).",
    ["model", "route"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
E2E_LATENCY = Histogram(
    "switchboard:e2e_request_latency_seconds",
    "From the request's arrival to its last byte.",
    ["model", "route"],
    buckets=REQUEST_BUCKETS,
    registry=REGISTRY,
)
PROMPT_TOKENS = Counter(
    "switchboard:prompt_tokens", "Prompt tokens of finished requests.", ["model", "route"], registry=REGISTRY
)
GENERATION_TOKENS = Counter(
    "switchboard:generation_tokens",
    "Tokens generated for finished requests.",
    ["model", "route"],
    registry=REGISTRY,
)
REQUESTS_IN_FLIGHT = Gauge(
    "switchboard:num_requests_in_flight",
    "Jobs this front door is waiting on (queued or running).",
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "switchboard:num_requests_waiting",
    "Jobs on the model's stream that no worker has taken yet (every front door reports it).",
    ["model"],
    registry=REGISTRY,
)
OLDEST_WAITING = Gauge(
    "switchboard:oldest_waiting_seconds",
    "How long the oldest job no worker has taken has waited (0 when none waits).",
    ["model"],
    registry=REGISTRY,
)
CONNECTIONS_OPEN = Gauge(
    "switchboard:connections_open",
    "HTTP connections open at this front door (at most router.max_connections).",
    registry=REGISTRY,
)
CONNECTIONS_CLOSED = Counter(
    "switchboard:connections_closed",
    "Connections the front door closed on its own, by reason: header_timeout, header_too_large, "
    "body_timeout (a pause), body_too_slow (under the minimum rate), body_deadline, "
    "answered_before_body (closed after an early answer, the rest of the body dropped), send_stall "
    "(the client took nothing of its answer), send_timeout (nor all of it in time), over_capacity "
    "(refused with a 503), idle_evicted (an idle keep-alive connection closed to make room).",
    ["reason"],
    registry=REGISTRY,
)
ROLLOUT_EVENTS = Counter(
    "switchboard:route_rollout_events",
    "Rollout events by route: started, step, check_failed, promoted, rolled_back, aborted (counted by "
    "the front door that judged them, or that the operator asked).",
    ["route", "event"],
    registry=REGISTRY,
)
ROUTE_WEIGHT = Gauge(
    "switchboard:route_weight",
    "A route's live weight (percent) for each of its target models (every front door reports it).",
    ["route", "model"],
    registry=REGISTRY,
)
