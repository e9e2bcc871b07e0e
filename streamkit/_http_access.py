"""Who may use an HTTP endpoint: the Host it is asked for, a token, security headers.

:func:`guarded` wraps an ASGI application (the dashboard, the metrics endpoint) with:

- a **Host check** (when ``allowed_hosts`` is given): a request whose ``Host`` header
  names another host is answered ``421 Misdirected Request``. This defeats DNS
  rebinding, where a web page on ``evil.example`` makes its name resolve to this
  machine and reads the endpoint from the victim's browser: the browser still sends
  ``Host: evil.example``. The address the client connected to is always accepted
  (a client that typed an IP address).
- a **token** (when ``token`` is given), compared in constant time
  (:func:`hmac.compare_digest`): ``Authorization: Bearer TOKEN`` (curl, Prometheus),
  or, for a browser, ``?token=TOKEN`` once, which answers with a redirect that sets
  an ``HttpOnly``, ``SameSite=Strict`` cookie (holding a value derived from the
  token, not the token) and drops the token from the address bar. Anything else is
  ``401 Unauthorized``.
- **security headers** on every answer: ``X-Content-Type-Options: nosniff``,
  ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and, unless the
  application sent its own, ``Content-Security-Policy: default-src 'none';
  frame-ancestors 'none'``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import urllib.parse
from typing import TYPE_CHECKING

import attrs

from ._errors import ConfigError

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGISendCallable,
        ASGISendEvent,
        Scope,
    )

__all__ = ["Access", "check_token", "guarded", "host_name", "is_loopback"]

#: The shortest token accepted: a guessable token, compared in constant time or not,
#: protects nothing.
MIN_TOKEN_LENGTH = 16
#: The cookie a browser gets after ``?token=``.
COOKIE = "streamkit_session"
#: The content security policy of an answer that did not set its own.
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'"

_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


def check_token(setting: str, token: str | None) -> str | None:
    """``token`` if it is usable (``None`` stays ``None``).

    Error handling:
        :class:`ConfigError` naming ``setting`` for a token shorter than
        :data:`MIN_TOKEN_LENGTH` characters.
    """
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            setting,
            f"a token must be at least {MIN_TOKEN_LENGTH} characters long, got "
            f"{len(token)} (make one with: python -c 'import secrets; "
            f"print(secrets.token_urlsafe())')",
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` serves this machine only (``localhost``,
    ``127.0.0.1``, ``::1``); a name other than ``localhost`` counts as not."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port, lower case:
    ``[::1]:8000`` -> ``::1``, ``Example.COM.:80`` -> ``example.com``."""
    header = header.strip()
    if header.startswith("["):
        name = header[1 : header.find("]")] if "]" in header else header[1:]
    else:
        name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".").lower()


@attrs.frozen(kw_only=True)
class Access:
    """Who may use an endpoint (see the module's documentation).

    Attributes:
        token: the token requests must carry; ``None``: none needed.
        allowed_hosts: the host names requests may be for (lower case), besides the
            address the client connected to; ``None``: any.
        browser_login: whether ``?token=`` logs a browser in (a cookie); otherwise
            only ``Authorization: Bearer`` is accepted.
        what: the endpoint, as messages name it.
    """

    token: str | None = attrs.field(default=None, repr=False)
    allowed_hosts: frozenset[str] | None = None
    browser_login: bool = False
    what: str = "this endpoint"

    def host_allowed(self, header: str | None, local_address: str | None) -> bool:
        """Whether a request with ``Host: header``, which arrived on
        ``local_address``, is for a host this endpoint serves."""
        if self.allowed_hosts is None:
            return True
        if not header:
            return False
        name = host_name(header)
        return name in self.allowed_hosts or (
            local_address is not None and name == local_address.lower()
        )

    def cookie_value(self) -> str:
        """What the session cookie holds: derived from the token, not the token."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"streamkit session", hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(given.encode(), self.token.encode())

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the request carries the token (a bearer token or the cookie)."""
        if self.token is None:
            return True
        scheme, _, credentials = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(credentials.strip()):
            return True
        cookie = _cookies(headers.get(b"cookie", b"")).get(COOKIE)
        return cookie is not None and hmac.compare_digest(
            cookie.encode(), self.cookie_value().encode()
        )


def _cookies(header: bytes) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in header.decode("latin-1").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            found.setdefault(name, value)
    return found


def guarded(app: ASGIFramework, access: Access) -> ASGIFramework:
    """``app`` behind ``access``'s Host check and token, with security headers."""

    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)
        host = headers.get(b"host", b"").decode("latin-1")
        server = scope.get("server")
        if not access.host_allowed(host, server[0] if server else None):
            await _answer(send, 421, f"{access.what} does not answer for host {host!r}\n")
            return
        if access.token is not None and access.browser_login:
            query = urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"))
            given = [value for name, value in query if name == "token"]
            if given:
                if not access.token_matches(given[0]):
                    await _unauthorized(send, access)
                    return
                await _log_in(send, access, scope["path"], query)
                return
        if not access.authorized(headers):
            await _unauthorized(send, access)
            return

        async def send_with_headers(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start":
                sent = list(message.get("headers", []))
                names = {name.lower() for name, _ in sent}
                sent += [header for header in _SECURITY_HEADERS if header[0] not in names]
                if b"content-security-policy" not in names:
                    sent.append((b"content-security-policy", DEFAULT_CSP.encode()))
                message = {**message, "headers": sent}
            await send(message)

        await app(scope, receive, send_with_headers)

    return wrapped


async def _log_in(
    send: ASGISendCallable, access: Access, path: str, query: list[tuple[str, str]]
) -> None:
    """Set the session cookie and send the browser back without the token."""
    rest = urllib.parse.urlencode([(name, value) for name, value in query if name != "token"])
    # Always a path on this host ("//elsewhere" would leave it).
    location = "/" + urllib.parse.quote(path).lstrip("/") + (f"?{rest}" if rest else "")
    cookie = f"{COOKIE}={access.cookie_value()}; Path=/; HttpOnly; SameSite=Strict"
    await _answer(
        send,
        303,
        "logged in\n",
        [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
    )


async def _unauthorized(send: ASGISendCallable, access: Access) -> None:
    how = (
        "open this address with ?token=TOKEN once in a browser, or send the header "
        "'Authorization: Bearer TOKEN'"
        if access.browser_login
        else "send the header 'Authorization: Bearer TOKEN'"
    )
    await _answer(
        send,
        401,
        f"{access.what} needs its token: {how}\n",
        [(b"www-authenticate", b'Bearer realm="streamkit"')],
    )


async def _answer(
    send: ASGISendCallable,
    status: int,
    text: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
                *_SECURITY_HEADERS,
                (b"content-security-policy", DEFAULT_CSP.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
