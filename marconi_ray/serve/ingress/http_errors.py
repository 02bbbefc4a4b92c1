"""The ingress's HTTP errors: OpenAI's error JSON (`APIError`) for every failure, with
`Retry-After` on the ones worth retrying (429 shed, 503 unavailable)."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from marconi_ray.serve.ingress.openai_protocol import APIError
from marconi_ray.serve.ingress.ray_backend import ReplicaUnavailable

logger = logging.getLogger("marconi_ray.serve.ingress.api")

SHED_RETRY_AFTER_S = 1
"""`Retry-After` of a request shed because every replica's queue is full (429)."""
UNAVAILABLE_RETRY_AFTER_S = 1
"""`Retry-After` of a 503: no replica could take the request, or planning failed."""


def cause_text(exc: BaseException) -> str:
    """The message of `exc`, or of the actor's exception a `RayTaskError` wraps."""
    cause = getattr(exc, "cause", None)
    return str(cause if isinstance(cause, BaseException) else exc)


def error_response(exc: APIError) -> JSONResponse:
    """`exc` as a response: its status, OpenAI's error body, its Retry-After if any."""
    headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def generation_error(exc: Exception) -> APIError:
    """The HTTP error of a failed generation: 503 with Retry-After when no replica could
    run it (`ReplicaUnavailable`), else 500 (logged)."""
    if isinstance(exc, ReplicaUnavailable):
        logger.warning("no replica could take a request: %s", exc)
        message = f"no replica could take the request: {exc}"
        return APIError(503, message, None, None, UNAVAILABLE_RETRY_AFTER_S)
    logger.error("generation failed", exc_info=exc)
    return APIError(500, f"generation failed: {cause_text(exc)}")


def install_error_handlers(app: FastAPI) -> None:
    """Render every error of `app` as OpenAI's error JSON (`APIError.body()`)."""

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        return error_response(APIError(400, f"invalid value for {param}: {err['msg']}", param))

    async def bad_json(_: Request, exc: Exception) -> Response:
        return error_response(APIError(400, f"request body is not valid JSON: {exc}"))

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return error_response(APIError(exc.status_code, str(exc.detail), None, code))

    async def internal(_: Request, exc: Exception) -> Response:
        logger.exception("unhandled error", exc_info=exc)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(json.JSONDecodeError, bad_json)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal)
