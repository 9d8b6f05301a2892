"""The steps of one embeddings, classification or rerank request, in order, and nothing else.

its gate (decode, check and bound the inputs: `router.gate.pooling`) -> the model (a configured one, of the endpoint's kind) -> build job ->
fits -> admit and queue (`router.queue.starts.JobRuns.queued`) -> wait for the one last chunk -> answer.
Every check runs before anything is queued, so a bad request costs no job. A pooling answer is never
streamed, so there is nothing to resume; a job whose worker dies is taken over by another worker as
any job is.
"""

from __future__ import annotations

from litestar import Response

from router.admission.auth import Caller
from router.admission.fits import ModelLimitsCache, check_pooling_fits
from router.admission.model_table import ModelTable
from router.gate.asks import ClassificationAsk, EmbeddingsAsk, RerankAsk
from router.http.answers import json_response
from router.intake.job import pooling_job
from router.openai.pooling_checks import (
    check_dimensions,
    check_model_kind,
    check_pooling_output,
    not_a_model,
)
from router.queue.starts import JobRuns
from router.relay.pooled import (
    PooledAnswer,
    classification_list,
    embedding_list,
    pooled_answer,
    rerank_response,
)
from router.routing.resolve import MODEL_HEADER
from router.routing.routes.route_table import RouteTable
from router.status.redis_health import RedisHealth
from router.telemetry.requests import arrival_id, note_operation
from switchboard.config import FrontDoorConfig, ModelConfig, ModelKind, PipelineLookup
from switchboard.wire import Job, PoolingTask


class PoolingFlow:
    """The steps of the embeddings, classification and rerank endpoints, over the parts each calls."""

    def __init__(
        self,
        runs: JobRuns,
        *,
        models: ModelTable,
        routes: RouteTable,
        pipelines: PipelineLookup,
        limits: ModelLimitsCache,
        health: RedisHealth,
        settings: FrontDoorConfig,
    ) -> None:
        self._runs = runs
        self._models = models
        self._routes = routes
        self._pipelines = pipelines
        self._limits = limits
        self._health = health
        self._settings = settings

    async def embeddings(self, caller: Caller, ask: EmbeddingsAsk) -> Response[bytes]:
        """`POST /v1/embeddings`, past its gate."""
        note_operation("embeddings")
        body, inputs = ask.body, ask.inputs
        model = self._model(body.model, caller, "embed", "embeddings")
        check_dimensions(model, body.dimensions)
        # The answer's size, where the model's own vector size is known (the gate checked `dimensions`).
        limits = await self._limits.get(model.name)
        check_pooling_output(model, len(inputs), body.dimensions, self._settings, limits)
        task = PoolingTask(
            task="embed",
            inputs=inputs,
            dimensions=body.dimensions,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            normalize=body.scaled_to_unit_length,
        )
        _, answer = await self._answered(task, model, caller, param="input")
        return json_response(embedding_list(answer, body), headers=_named(model))

    async def classify(self, caller: Caller, ask: ClassificationAsk) -> Response[bytes]:
        """`POST /classify`, past its gate."""
        note_operation("classify")
        body, inputs = ask.body, ask.inputs
        model = self._model(body.model, caller, "classify", "classification")
        task = PoolingTask(task="classify", inputs=inputs, truncate_prompt_tokens=body.truncate_prompt_tokens)
        job, answer = await self._answered(task, model, caller, param="input")
        return json_response(classification_list(answer, job, body.model), headers=_named(model))

    async def rerank(self, caller: Caller, ask: RerankAsk) -> Response[bytes]:
        """`POST /rerank`, past its gate."""
        note_operation("rerank")
        body, documents = ask.body, ask.documents
        model = self._model(body.model, caller, "score", "rerank")
        task = PoolingTask(
            task="score",
            inputs=documents,
            query=body.query,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
        )
        job, answer = await self._answered(task, model, caller, param="documents")
        return json_response(
            rerank_response(
                answer,
                job,
                body.model,
                documents=documents,
                top_n=body.top_n,
                return_documents=body.return_documents,
            ),
            headers=_named(model),
        )

    def _model(self, name: str, caller: Caller, kind: ModelKind, api: str) -> ModelConfig:
        """The configured model `name` names: a 400 for a route or a pipeline (they serve text
        generation), a 404 for no model, a 403 for one the caller's key may not use, a 400 for one of
        another kind than the endpoint's."""
        is_route = self._routes.get(name) is not None or self._pipelines.get(name) is not None
        if is_route and caller.may_use(name):
            raise not_a_model(name, api)
        model = self._models.resolve(name, caller)
        check_model_kind(model, kind, api)
        return model

    async def _answered(
        self, task: PoolingTask, model: ModelConfig, caller: Caller, *, param: str
    ) -> tuple[Job, PooledAnswer]:
        """`task` queued as a job of `model` and its answer, once its last chunk came; `param` names
        the inputs in a refusal for their length."""
        job = pooling_job(model.name, task, timeout_s=self._settings.request_timeout_s, job_id=arrival_id())
        self._health.require_up()
        await check_pooling_fits(self._limits, task, model.name, param)
        run = await self._runs.queued(job, caller)
        try:
            return run.job, await pooled_answer(run.chunks(), run.job, model.name)
        finally:
            await run.close()


def _named(model: ModelConfig) -> dict[str, str]:
    """The header that names the model that answered, as a generation's answer has it."""
    return {MODEL_HEADER: model.name}
