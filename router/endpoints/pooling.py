"""The pooling endpoints: OpenAI's embeddings, vLLM's classification, and the rerank API at the paths
vLLM serves it (`/rerank`, `/v1/rerank`, and `/v2/rerank` for Cohere's clients), through
`router.pooling_flow`. Each answers once, as JSON: nothing is streamed.

Each asks for one part and reads its caller from the request (`caller_of`: the guard resolved it
already): Litestar resolves two or more dependencies in a task group of their own, two tasks and a
cancel scope per request, a twentieth of the front door's CPU per embedding at 128 clients.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from router.admission.auth import caller_of
from router.gate.gate import GATE_OPT
from router.gate.pooling import CLASSIFY, EMBEDDINGS, RERANK
from router.pooling_flow import PoolingFlow


@post("/v1/embeddings", status_code=200, opt={GATE_OPT: EMBEDDINGS})
async def create_embeddings(request: Request[Any, Any, Any], pooling: PoolingFlow) -> Response[bytes]:
    """OpenAI Embeddings: a vector per input, as floats or base64."""
    return await pooling.embeddings(await caller_of(request), await EMBEDDINGS.passed(request))


@post(["/classify", "/v1/classify"], status_code=200, opt={GATE_OPT: CLASSIFY})
async def classify(request: Request[Any, Any, Any], pooling: PoolingFlow) -> Response[bytes]:
    """vLLM's classification API: each input's label and every label's probability."""
    return await pooling.classify(await caller_of(request), await CLASSIFY.passed(request))


@post(["/rerank", "/v1/rerank", "/v2/rerank"], status_code=200, opt={GATE_OPT: RERANK})
async def rerank(request: Request[Any, Any, Any], pooling: PoolingFlow) -> Response[bytes]:
    """The rerank API: the documents by relevance to the query, most relevant first."""
    return await pooling.rerank(await caller_of(request), await RERANK.passed(request))
