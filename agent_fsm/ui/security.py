"""What keeps the ui safe by default, as plain ASGI middleware and checks (no framework).

- **Who may connect.** Bound to a loopback address, the ui takes requests whose ``Host`` is
  that address (or ``localhost``): a page of another site cannot reach it through DNS
  rebinding. Any other bind needs a token (the command refuses to start without one), given
  once as ``?token=`` (kept in an HttpOnly, SameSite=Strict cookie, and the address
  rewritten without it) or as ``Authorization: Bearer``.
- **Actions are POSTs with a CSRF token**, the server's own random one, embedded in its
  forms; another site cannot read a page to learn it. A POST whose ``Origin`` is another
  host is refused too.
- **Nothing runs in the page but the packaged script**: a Content-Security-Policy of
  ``'self'`` only, no inline script or style, no framing (``X-Frame-Options: DENY``), no
  caching of pages, no referrer sent to another site (a same-origin one, so that a form's
  ``Origin`` is its own and not ``null``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

__all__ = ["COOKIE", "SECURITY_HEADERS", "Guard", "same_origin", "tokens_match"]

COOKIE = "agent_fsm_ui"
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def tokens_match(given: str | None, expected: str) -> bool:
    """Compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def same_origin(origin: str | None, host: str | None) -> bool:
    """A POST's ``Origin`` names the server's own host (or is absent, as for a same-origin
    form in some browsers)."""
    if origin is None:
        return True
    if host is None:
        return False
    return origin.split("://", 1)[-1].rstrip("/") == host


class Guard:
    """The middleware: the host check, the token, the security headers."""

    def __init__(self, app: App, *, token: str | None, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts
        """The host names a loopback-bound ui answers to; None when a token guards it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if self.hosts is not None and _hostname(headers.get("host", "")) not in self.hosts:
            await _plain(send, 400, "this address is not the ui's")
            return
        if self.token is not None:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            if tokens_match(query.get("token"), self.token):
                del query["token"]
                target = quote(scope["path"]) + (f"?{urlencode(query)}" if query else "")
                cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
                await _redirect(send, target, cookie)
                return
            cookies = SimpleCookie(headers.get("cookie", ""))
            given = cookies[COOKIE].value if COOKIE in cookies else None
            bearer = headers.get("authorization", "")
            if bearer.lower().startswith("bearer "):
                given = bearer[7:].strip()
            if not tokens_match(given, self.token):
                await _plain(send, 401, "open the address the ui printed: it has the token")
                return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, secured)


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, target: str, cookie: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", target.encode("latin-1")),
                (b"set-cookie", cookie.encode("latin-1")),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})
