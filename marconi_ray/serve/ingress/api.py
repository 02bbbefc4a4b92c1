"""The OpenAI-compatible HTTP front door: `build_app` (a FastAPI app over any `Backend`)
and the Ray Serve deployment `OpenAIIngress` that serves it over the coordinator actor
and the replica deployment (`RayBackend`).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both stream as SSE with
`stream: true`), `GET /v1/models`, `GET /health`, `GET /metrics`; nothing else (no docs,
no OpenAPI schema, no endpoint that changes the cache or alpha). Every request is fully
validated first (`prepare`: JSON, types, model name, prompt tokens, context limit, sampling)
before the backend sees it; every error is OpenAI's error JSON (`openai_protocol.ErrorResponse`):
400 bad input, 401 missing or wrong API key (`invalid_api_key`, when a key is set; see
`security`), 404 unknown model (`model_not_found`) or route, 413 body over the limit
(`request_too_large`), 500 internal failure, 503 (with `Retry-After`) when the coordinator
cannot plan or no replica can run the request (e.g. its node was lost and every re-plan
failed). A streamed response starts only once its first piece of output is there, so
those failures get their status too; after that, an error is an `error` event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import ray
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.serve.handle import DeploymentHandle

from marconi_ray.serve.detached import detached
from marconi_ray.serve.ingress.formats import ChatFormat, CompletionFormat, Formatter
from marconi_ray.serve.ingress.generation import (
    Backend,
    Detokenizer,
    EventStream,
    Piece,
    run_request,
)
from marconi_ray.serve.ingress.http_errors import (
    SHED_RETRY_AFTER_S,
    UNAVAILABLE_RETRY_AFTER_S,
    cause_text,
    error_response,
    generation_error,
    install_error_handlers,
)
from marconi_ray.serve.ingress.metrics import CONTENT_TYPE, IngressMetrics, render_metrics
from marconi_ray.serve.ingress.mover import Mover
from marconi_ray.serve.ingress.openai_protocol import APIError
from marconi_ray.serve.ingress.prepare import (
    Prepared,
    ServedModel,
    prepare_chat,
    prepare_completion,
)
from marconi_ray.serve.ingress.ray_backend import RayBackend
from marconi_ray.serve.ingress.responses import ModelCard, ModelList
from marconi_ray.serve.ingress.security import (
    DEFAULT_MAX_BODY_BYTES,
    SecurityMiddleware,
    check_options,
)
from marconi_ray.serve.messages import Dispatch, Overloaded, ReplicaStats
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.serve.transfer_modes import transfer_mode

__all__ = ["Backend", "EventStream", "IngressServer", "OpenAIIngress", "RayBackend", "build_app"]

logger = logging.getLogger(__name__)
OFFLOAD_BYTES = 16_384
"""Bodies larger than this are parsed, size-checked and tokenized in a worker thread (the
tokenizer releases the GIL), so the event loop keeps answering `/health` and streaming;
smaller ones are prepared inline (a thread hop would cost more than the work)."""
HEALTH_TIMEOUT_S = 5.0
COORDINATOR_WAIT_S = 30.0


async def _chain(first: Piece, rest: AsyncIterator[Piece]) -> AsyncGenerator[Piece, None]:
    yield first
    async for piece in rest:
        yield piece


class ClosingStreamingResponse(StreamingResponse):
    """A `StreamingResponse` that calls `on_close` however it ends: sent to the end, the
    client gone before the first byte (its body generator then never starts, so that
    generator's own `finally` never runs), or the ASGI task cancelled. `on_close` must be
    idempotent and must not block (it runs in a task that may be cancelled)."""

    def __init__(self, content: Any, on_close: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


# ---------------------------------------------------------------------- the app
class _Server:
    """Request handling shared by the two generation endpoints."""

    def __init__(
        self,
        backend: Backend,
        model: ServedModel,
        metrics: IngressMetrics,
        stream_interval: int = 1,
    ) -> None:
        self.backend = backend
        self.model = model
        self.metrics = metrics
        self.stream_interval = stream_interval
        self._orphans: set[asyncio.Task[None]] = set()

    async def plan(self, prepared: Prepared, arrival: float) -> Dispatch:
        """Plan via the backend; a plan whose caller went away is still started and
        cancelled at once, so the backend releases it."""
        task = asyncio.ensure_future(self.backend.plan(prepared.prompt, prepared.params, arrival))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._release_orphan)
            raise
        except ValueError as exc:
            raise APIError(400, cause_text(exc)) from None
        except Overloaded as exc:
            raise APIError(429, str(exc), None, "overloaded", SHED_RETRY_AFTER_S) from None
        except Exception as exc:
            logger.exception("planning failed")
            raise APIError(
                503,
                f"the coordinator could not plan the request: {cause_text(exc)}",
                None,
                None,
                UNAVAILABLE_RETRY_AFTER_S,
            ) from None

    def _release_orphan(self, task: asyncio.Future[Dispatch]) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:  # nothing was planned, so nothing to release
            logger.info("planning for a departed client failed: %s", task.exception())
            return
        detached(self._drain(task.result()), self._orphans)

    async def _drain(self, dispatch: Dispatch) -> None:
        """Start a departed client's dispatch and stop it at its first event, so the
        replica ends it the usual way (runs outside the client's request context)."""
        stream = self.backend.generate(dispatch)
        try:
            async for _ in stream:
                break
        finally:
            stream.cancel()

    def _prepare(self, raw: bytes, prepare: Callable[[object, ServedModel], Prepared]) -> Prepared:
        """Parse and validate a body (APIError naming what is wrong); the prompt's size is
        bounded before it is tokenized (see `prepare`)."""
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from None
        except RecursionError:  # json.loads on deeply nested arrays/objects
            raise APIError(400, "request body is nested too deeply") from None
        return prepare(body, self.model)

    async def handle(
        self, request: Request, prepare: Callable[[object, ServedModel], Prepared], fmt: Formatter
    ) -> Response:
        arrival, created = time.perf_counter(), int(time.time())
        try:
            raw = await request.body()
            if len(raw) > OFFLOAD_BYTES:
                prepared = await asyncio.to_thread(self._prepare, raw, prepare)
            else:
                prepared = self._prepare(raw, prepare)
            dispatch = await self.plan(prepared, time.time())
        except APIError as exc:
            self.metrics.count(exc.status)
            return error_response(exc)
        req = prepared.request
        fmt.configure(
            req,
            prepared.prompt,
            self.model.tokenizer,
            dispatch.order.hit_len,
            prepared.output.parser,
        )
        detok = Detokenizer(self.model.tokenizer, req.stop_strings())
        events = self.backend.generate(dispatch, req.stream)
        interval = self.stream_interval if req.stream else 1
        pieces = run_request(events, dispatch, detok, arrival, self.metrics, interval)
        if req.stream:
            # the response starts with the first piece: a request that no replica can
            # take gets its status (503) instead of a 200 with an error event
            try:
                first = await pieces.__anext__()
            except Exception as exc:
                await pieces.aclose()
                error = generation_error(exc)
                self.metrics.count(error.status)
                return error_response(error)
            body = _chain(first, pieces)
            chunks = fmt.chunks(self.model.name, created, body, req.include_usage)
            sse = self._sse(chunks, pieces)
            return ClosingStreamingResponse(sse, events.cancel, "text/event-stream")
        got: list[Piece] = []
        try:
            async for piece in pieces:
                got.append(piece)
        except Exception as exc:
            error = generation_error(exc)
            self.metrics.count(error.status)
            return error_response(error)
        finally:
            await pieces.aclose()
        self.metrics.count(200)
        whole = fmt.whole(self.model.name, created, got)
        return JSONResponse(whole.model_dump())

    async def _sse(
        self, chunks: AsyncGenerator[BaseModel, None], pieces: AsyncGenerator[Piece, None]
    ) -> AsyncIterator[str]:
        status = 499  # the client went away unless we get to the end
        try:
            try:
                async for chunk in chunks:
                    yield f"data: {chunk.model_dump_json()}\n\n"
                status = 200
            except Exception as exc:
                error = generation_error(exc)
                status = error.status
                yield f"data: {json.dumps(error.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await chunks.aclose()
            await pieces.aclose()
            self.metrics.count(status)


GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
ROUTES = frozenset({*GENERATION_PATHS, "/v1/models", "/health", "/metrics"})
"""Every path the app serves (tests assert there is no other)."""


def build_app(
    backend: Backend,
    model: ServedModel,
    metrics: IngressMetrics | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    stream_interval: int = 1,
) -> FastAPI:
    """The OpenAI API over `backend` for `model` (a fresh `IngressMetrics` unless given).

    With `api_key`, every request but `GET /health` needs `Authorization: Bearer <api_key>`
    (401 otherwise); bodies over `max_body_bytes` get 413 (see `security.SecurityMiddleware`).
    A streamed answer sends a chunk per `stream_interval` tokens at least (the last one
    carries the rest), like vLLM's `--stream-interval`.
    """
    check_options(api_key, max_body_bytes)  # fail here, not at the first request
    if isinstance(stream_interval, bool) or not isinstance(stream_interval, int):
        raise ValueError(f"stream_interval must be an integer >= 1, got {stream_interval!r}")
    if stream_interval < 1:
        raise ValueError(f"stream_interval must be an integer >= 1, got {stream_interval}")
    server = _Server(backend, model, metrics or IngressMetrics(), stream_interval)
    app = FastAPI(title="marconi-ray", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)

    def rejected(path: str, status: int) -> None:
        if path in GENERATION_PATHS:
            server.metrics.count(status)

    app.add_middleware(
        SecurityMiddleware, api_key=api_key, max_body_bytes=max_body_bytes, on_reject=rejected
    )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.handle(request, prepare_completion, CompletionFormat())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.handle(request, prepare_chat, ChatFormat())

    @app.get("/v1/models")
    async def models() -> Response:
        card = ModelCard(id=model.name, created=model.created)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    async def health() -> Response:
        """200 with `replicas` (live and confirmed), `registered` and `journal` when at
        least one replica can serve; 503 otherwise (OpenAI's error JSON)."""
        try:
            report = await asyncio.wait_for(backend.health(), HEALTH_TIMEOUT_S)
        except Exception as exc:
            logger.warning("health check: coordinator unavailable (%s)", cause_text(exc))
            return error_response(APIError(503, f"coordinator unavailable: {cause_text(exc)}"))
        if not report["replicas"]:
            registered = report["registered"]
            message = f"no model replica can serve ({registered} registered, none live)"
            return error_response(APIError(503, message))
        return JSONResponse({"status": "ok", **report})

    @app.get("/metrics")
    async def metrics_text() -> Response:
        stats: list[ReplicaStats] | None
        journal: dict[str, Any] | None
        findings: list[str] | None
        try:
            stats, runs = await backend.stats(), await backend.tuner_runs()
            health = await backend.health()
            journal = health["journal"]
            findings = [f["code"] for f in health.get("findings", [])]
        except Exception:
            logger.warning("metrics: coordinator unavailable; cache figures left out")
            stats, runs, journal, findings = None, 0, None, None
        body = render_metrics(server.metrics, stats, runs, journal, findings)
        return Response(body, media_type=CONTENT_TYPE)

    return app


# ---------------------------------------------------------------------- Ray Serve
async def find_coordinator(name: str, timeout_s: float = COORDINATOR_WAIT_S) -> Any:
    """The coordinator actor `name` (namespace `NAMESPACE`), waiting up to `timeout_s`
    for it to come up; RuntimeError naming it when it does not."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"coordinator actor {name!r} (namespace {NAMESPACE!r}) "
                    f"not found after {timeout_s:.0f} s"
                ) from None
            await asyncio.sleep(0.5)


class IngressServer:
    """The HTTP ingress replica (deployed as `OpenAIIngress`).

    The app is built at replica start (`__serve_build_asgi_app__`, awaited by Serve): it
    waits for the coordinator, loads the tokenizer and model config from the model folder
    on this node (`settings.local_model_dir()`), and serves `build_app` over a `RayBackend`.
    """

    def __init__(self, settings: ServeSettings, replicas: DeploymentHandle[Any]) -> None:
        self.settings = settings
        self.replicas = replicas
        self.backend: RayBackend | None = None
        self._warming: asyncio.Task[None] | None = None
        """Forms the transfer groups once the replicas registered (`Mover.warm`)."""

    async def __serve_build_asgi_app__(self) -> FastAPI:
        settings = self.settings
        coordinators = [await find_coordinator(s.coordinator_name) for s in settings.group()]
        model = ServedModel.load(
            settings.local_model_dir(), settings.model_name, settings.tool_call_parser
        )
        metrics = IngressMetrics()
        mover = None
        if settings.disagg.moves:
            mode = transfer_mode(settings.disagg.transfer, settings.device, settings.tp)
            timeout = settings.disagg.transfer_timeout_s
            mover = Mover(self.replicas, coordinators[0], mode, timeout, metrics)
            self._warming = detached(mover.warm(settings.replicas))
        self.backend = RayBackend(
            coordinators,
            self.replicas,
            metrics,
            key_tokens=settings.group_key_tokens,
            mover=mover,
        )
        return build_app(
            self.backend,
            model,
            metrics,
            api_key=self.settings.api_key,
            max_body_bytes=self.settings.max_body_bytes,
            stream_interval=self.settings.stream_interval,
        )

    async def __del__(self) -> None:
        """Serve stops this replica (after its HTTP requests ended): close its streams
        from the model replicas, so they drain at once instead of at their timeout."""
        if self.backend is not None:
            self.backend.close()


OpenAIIngress = serve.deployment(name="OpenAIIngress")(serve.ingress()(IngressServer))
"""The ingress deployment: `OpenAIIngress.bind(settings: ServeSettings, replicas)`."""
