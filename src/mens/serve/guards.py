"""What a request must pass before the app sees it: the API key, then a bounded body.

Both are pure ASGI middleware (no `BaseHTTPMiddleware`, which buffers streams and hides disconnects).
The body limit counts bytes as they arrive, so a chunked body (no Content-Length) is cut off as surely as
a declared one: past `max_bytes` the client gets 413, and a body that trickles in slower than
`body_timeout_s` gets 408. Both answers close the connection, so the rest of an upload is never read.
Not covered: slow clients that hold many idle connections (uvicorn's keep-alive timeout and a reverse
proxy are the tools for that).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mens.errors import UsageError
from mens.serve.errors import error_response

API_KEY_ENV = "MENS_API_KEY"
"""Environment variable the key can come from (argv is visible to other users of the machine)."""

OPEN_PATHS = ("/health",)
"""Paths answered without the API key (liveness probes)."""


class ApiKeyGuard:
    """401 unless `Authorization: Bearer <key>` matches (compared in constant time)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.expected is None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(sent, self.expected):
            response = error_response(scope["path"], 401,
                                      "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                      type_="authentication_error", code="invalid_api_key",
                                      headers={"connection": "close"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Read the whole body first (at most `max_bytes`, within `body_timeout_s`), then hand it to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout_s: float = 30.0):
        self.app, self.max_bytes, self.body_timeout_s = app, max_bytes, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, 413, f"request body is {int(declared)} bytes; "
                               f"the limit is {self.max_bytes}", "too_large")
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body, disconnected = await self._read(receive)
        except TimeoutError:
            await self._refuse(scope, receive, send, 408, f"request body not received within {self.body_timeout_s} s; "
                               "send the whole body at once", "body_timeout")
            return
        if body is None:
            await self._refuse(scope, receive, send, 413, f"request body exceeds the limit of {self.max_bytes} "
                               "bytes; send a shorter prompt", "too_large")
            return
        if disconnected:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # later calls only ever see http.disconnect

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> tuple[bytearray | None, bool]:
        """The body (None once it passes the limit) and whether the client left before sending all of it."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return body, True
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return None, False
            if not message.get("more_body", False):
                return body, False

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str, code: str) -> None:
        response = error_response(scope["path"], status, message, code=code, headers={"connection": "close"})
        await response(scope, receive, send)


def resolve_api_key(api_key: str | None, api_key_file: Path | None) -> str | None:
    """The key from `--api-key` (or MENS_API_KEY) or from the first line of `--api-key-file`."""
    if api_key and api_key_file:
        raise UsageError("--api-key (or MENS_API_KEY) and --api-key-file are both set; give the key one way")
    if api_key_file is None:
        return api_key or None
    try:
        key = api_key_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--api-key-file {api_key_file}: cannot read it ({e}); point it at a text file "
                         "holding the key") from e
    if not key or "\n" in key:
        raise UsageError(f"--api-key-file {api_key_file}: expected one line holding the key, "
                         f"found {len(key.splitlines())} lines")
    return key


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

