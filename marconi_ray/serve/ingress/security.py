"""Request gatekeeping for the OpenAI app: bearer-token authentication and a body-size limit.

`SecurityMiddleware` is a pure ASGI middleware (it sees every HTTP request before routing):

- With an API key set, every request except `GET /health` (the `/v1/*` API, `/metrics` and
  any unknown path) must send `Authorization: Bearer <key>`; otherwise 401 with OpenAI's
  error JSON (`code: invalid_api_key`) and a `WWW-Authenticate: Bearer` header. The key is
  compared in constant time (`check_bearer`) and never logged or echoed.
- A body larger than `max_body_bytes` is refused with 413 (`code: request_too_large`):
  at once when `Content-Length` says so, and while reading when the body is chunked (no
  `Content-Length`) or longer than declared (`BodyTooLarge` is raised out of `receive`,
  which the app renders as the 413; nothing is planned). A malformed `Content-Length`
  is a 400.

Authentication is checked before the size, so an unauthenticated client learns nothing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marconi_ray.serve.ingress.openai_protocol import APIError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MIN_BODY_BYTES",
    "OPEN_PATHS",
    "BodyTooLarge",
    "SecurityMiddleware",
    "check_bearer",
    "check_options",
    "route_path",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1_048_576
MIN_BODY_BYTES = 1024
OPEN_PATHS = frozenset({"/health"})
"""Paths served without the API key."""

Reject = Callable[[str, int], None]
"""Called with (route path, status) for every request the middleware refuses."""


def check_bearer(header: str | None, key: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <key>` (scheme case-insensitive).

    The token is compared with `hmac.compare_digest` on bytes, in time that does not depend
    on how much of it matches the key.

    Raises:
        ValueError: for an empty `key` (it would accept an empty token).
    """
    if not key:
        raise ValueError("the API key must be a non-empty string")
    if header is None:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    token = token.strip()
    if not token:
        return False
    return hmac.compare_digest(
        token.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass")
    )


class BodyTooLarge(APIError):
    """The request body is over the limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"request body is larger than the limit of {limit} bytes",
            None,
            "request_too_large",
        )


def _unauthorized(header: str | None) -> APIError:
    message = (
        "missing API key: send it as 'Authorization: Bearer <key>'"
        if header is None
        else "incorrect API key provided"
    )
    return APIError(401, message, None, "invalid_api_key")


def route_path(scope: Scope) -> str:
    """The path the router matches: `path` less the `root_path` prefix (as Starlette does),
    so a mount under a route prefix (Ray Serve) is checked like a bare app."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        if path == root:
            return ""
        if path[len(root)] == "/":
            return path[len(root) :]
    return path


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]


def _content_length(scope: Scope) -> int | None:
    """The declared body size; None when absent; APIError 400 when malformed."""
    values = {v.strip() for v in _headers(scope, b"content-length")}
    if not values:
        return None
    (value,) = values if len(values) == 1 else ("",)
    if not (value.isascii() and value.isdigit()):  # isdigit alone accepts '²'
        raise APIError(400, "malformed Content-Length header")
    return int(value)


def check_options(api_key: str | None, max_body_bytes: int) -> None:
    """ValueError (never naming the key) unless `api_key` is None or a non-empty string
    and `max_body_bytes` an int >= `MIN_BODY_BYTES`."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise ValueError("api_key must be a non-empty string or None")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise ValueError(f"max_body_bytes must be an int, got {type(max_body_bytes).__name__}")
    if max_body_bytes < MIN_BODY_BYTES:
        raise ValueError(f"max_body_bytes must be >= {MIN_BODY_BYTES}, got {max_body_bytes}")


class SecurityMiddleware:
    """ASGI middleware: API-key check (when `api_key` is set) and the body-size limit.

    Args:
        app: the wrapped ASGI app.
        api_key: the bearer token to require, or None for no authentication.
        max_body_bytes: largest body accepted (>= `MIN_BODY_BYTES`).
        on_reject: told (route path, status) of every request refused here.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        on_reject: Reject | None = None,
    ) -> None:
        check_options(api_key, max_body_bytes)
        self.app = app
        self._key = api_key
        self.max_body_bytes = max_body_bytes
        self.on_reject = on_reject

    def __repr__(self) -> str:  # never show the key
        auth = "on" if self._key is not None else "off"
        return f"SecurityMiddleware(auth={auth}, max_body_bytes={self.max_body_bytes})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if self._key is not None and path not in OPEN_PATHS:
            auth = _headers(scope, b"authorization")
            header = auth[0] if auth else None
            if not check_bearer(header, self._key):
                await self._refuse(scope, receive, send, path, _unauthorized(header))
                return
        try:
            declared = _content_length(scope)
        except APIError as exc:
            await self._refuse(scope, receive, send, path, exc)
            return
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(scope, receive, send, path, BodyTooLarge(self.max_body_bytes))
            return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:  # the app let it through (FastAPI renders it itself)
            if started:
                logger.warning("request body over the limit after the response started")
                return
            await self._refuse(scope, receive, send, path, exc)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, path: str, exc: APIError
    ) -> None:
        if self.on_reject is not None:
            self.on_reject(path, exc.status)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        response = JSONResponse(exc.body(), status_code=exc.status, headers=headers)
        await response(scope, receive, send)
