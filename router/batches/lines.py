"""One line of a batch run as the request it is: through its endpoint's gate, the model's checks and
the same queue as a live request, its answer assembled as a non-streamed answer is.

What a line gets is what a client sending its body would have got: the answer (its output line) or
the error in OpenAI's shape with its status (its error line). A refusal that passes (a key's rate
limit, no worker alive yet, Redis away) is neither: the line is left to run again later.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from router.admission.auth import Caller
from router.admission.fits import ModelLimitsCache, check_job_fits
from router.admission.model_table import ModelTable
from router.files.batch_lines import BATCH_ENDPOINTS
from router.gate.asks import ChatAsk, EmbeddingsAsk, GenerationAsk
from router.gate.body import decoded
from router.intake.prepare import prepared
from router.intake.request_images import check_images_taken, fetched_images
from router.openai.errors import EngineError, OpenAIError
from router.openai.pooling_checks import check_model_kind
from router.pooling_flow import PoolingFlow
from router.queue.starts import JobRuns
from router.relay.answer import served_chunks
from switchboard.config import FrontDoorConfig
from switchboard.wire import Tier

logger = logging.getLogger(__name__)

# Statuses that say "later", not "never": the line runs again on a later pass.
RETRY_LATER = frozenset({429, 503})


class BatchLine(msgspec.Struct, kw_only=True):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """What a line got: an HTTP status and the body a client would have read."""

    status_code: int
    body: Any

    @property
    def ok(self) -> bool:
        return self.status_code == 200

    @property
    def passes(self) -> bool:
        """Whether the refusal passes (the line is to run again later)."""
        return self.status_code in RETRY_LATER


class LineRunner:
    """Runs batch lines on the front door's parts, as the caller whose batch it is."""

    def __init__(
        self,
        *,
        models: ModelTable,
        limits: ModelLimitsCache,
        runs: JobRuns,
        pooling: PoolingFlow,
        settings: FrontDoorConfig,
    ) -> None:
        self._models = models
        self._limits = limits
        self._runs = runs
        self._pooling = pooling
        self._settings = settings

    async def answer(self, line: BatchLine, caller: Caller, *, tier: Tier, timeout_s: float) -> LineAnswer:
        """The line's answer, its job in `tier` with `timeout_s` to run (what is left of its batch's
        window)."""
        try:
            return await self._answer(line, caller, tier, timeout_s)
        except OpenAIError as error:
            return LineAnswer(error.status_code, msgspec.to_builtins(error.body()))
        except Exception:  # a bug must fail one line, never the batch's runner
            logger.exception("a batch line failed", extra={"custom_id": line.custom_id})
            failure = EngineError("The request failed in the front door; it was logged.")
            return LineAnswer(500, msgspec.to_builtins(failure.body()))

    async def _answer(self, line: BatchLine, caller: Caller, tier: Tier, timeout_s: float) -> LineAnswer:
        gate, _ = BATCH_ENDPOINTS[line.url]
        ask = gate.check(decoded(bytes(line.body), gate.decoder), self._settings)
        if isinstance(ask, EmbeddingsAsk):
            response = await self._pooling.embeddings(caller, ask)
            return LineAnswer(response.status_code or 200, json.loads(response.content))
        return LineAnswer(200, await self._generated(ask, caller, tier, timeout_s))

    async def _generated(self, ask: GenerationAsk, caller: Caller, tier: Tier, timeout_s: float) -> Any:
        model = self._models.resolve(ask.model, caller)
        check_model_kind(model, "generate", ask.api)
        images: tuple[Any, ...] = ()
        if isinstance(ask, ChatAsk) and ask.images:
            check_images_taken(
                ask.images, model=model.name, takes_images=self._models.takes_images(model.name)
            )
            images = await fetched_images(ask.images, self._settings)
        made = prepared(
            ask,
            model,
            timeout_s=timeout_s,
            job_id=None,
            owner=caller.owner,
            images=images,
            tier=tier,
        )
        await check_job_fits(self._limits, made.job, template_renders_tools=made.template_renders_tools)
        run = await self._runs.queued(made.job, caller)
        try:
            answer = await made.relay.assemble(served_chunks(run, made.relay))
        finally:
            await run.close()
        return msgspec.to_builtins(answer)
