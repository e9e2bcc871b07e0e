"""``streamkit dashboard``: a web view of an app, with the job queue's controls, served
on Trio.

A tiny ASGI application. Reading, ``GET``:

- ``/``: one HTML page (inline CSS and JavaScript; no CDN, nothing fetched from
  elsewhere) that polls ``/api/status`` every second and draws the partitions, the
  workers, the job queue and a rolling throughput and lag chart;
- ``/api/status``: the latest snapshot, the JSON of ``streamkit status --json`` with
  rates (see :func:`~streamkit._cli._fleet.fleet_json`), plus ``error`` when the latest
  reading of Redis failed, and ``controls``: what is paused, whether the actions are
  on, and the page's anti-forgery token;
- ``/api/jobs/ID``: what the queue knows of one job.

Acting, ``POST`` (the job queue's controls): ``/api/jobs/ID/abort``, ``/api/jobs/ID/
replay`` and ``/api/jobs/ID/purge`` (a dead job), ``/api/pause`` and ``/api/resume``
(the queue; ``/api/pause/NAME`` for one job name). They are behind the dashboard's
token like everything else (on an address other machines reach it has one, unless
``--no-auth``, which turns the actions off), and forged requests are refused (see
:func:`forged`): a request must carry the anti-forgery token in an
``X-CSRF-Token`` header (a page of another site can neither read it nor set such a
header without this server's leave, which it never gives), and come from this origin
when the browser says where it comes from.

One task reads Redis every ``interval`` seconds however many pages are open (pages
get the latest reading), so the dashboard's load on Redis does not grow with its
viewers. No framework: a few fixed routes do not need one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import importlib.resources
import logging
import re
import secrets
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from .._errors import ConfigError, JobNotFound, StreamkitError
from .._http import serve_asgi
from .._http_access import Access, check_token, guarded, host_name, is_loopback
from .._nurseries import open_service_nursery
from ._fleet import FleetSample, app_job_queue_of, fleet_json, fleet_samples, job_json
from ._watch import until_signal

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

    from .._app import App

__all__ = ["Dashboard", "dashboard_access", "forged", "page_policy", "run_dashboard"]

log = logging.getLogger("streamkit.dashboard")

_JOB_PREFIX = "/api/jobs/"
#: The header that carries the anti-forgery token of a POST.
CSRF_HEADER = b"x-csrf-token"
_ACTIONS = ("abort", "replay", "purge")


def forged(headers: dict[bytes, bytes], token: str) -> str | None:
    """Why a POST with ``headers`` may come from another site's page; ``None`` if it
    carries ``token`` (the page's anti-forgery token) and, where the browser says
    where it comes from (``Sec-Fetch-Site``, ``Origin``), comes from this origin."""
    given = headers.get(CSRF_HEADER, b"").decode("latin-1")
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        return "missing or wrong X-CSRF-Token"
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
    if site and site not in ("same-origin", "none"):
        return f"a request from another site ({site})"
    origin = headers.get(b"origin", b"").decode("latin-1")
    if origin:
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if urllib.parse.urlsplit(origin).netloc.lower() != host:
            return f"a request from another origin ({origin})"
    return None


def _page() -> bytes:
    return importlib.resources.files("streamkit._cli").joinpath("_dashboard.html").read_bytes()


def page_policy(page: bytes) -> str:
    """The page's content security policy: its own inline script and style (by their
    hashes) and requests to its own origin, nothing else; no framing."""

    def hashes(tag: bytes) -> str:
        found = re.findall(rb"<" + tag + rb">(.*?)</" + tag + rb">", page, flags=re.DOTALL)
        digests = [base64.b64encode(hashlib.sha256(body).digest()).decode() for body in found]
        return " ".join(f"'sha256-{digest}'" for digest in digests)

    return (
        f"default-src 'none'; script-src {hashes(b'script')}; style-src {hashes(b'style')}; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


#: The host names the dashboard always answers for.
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def dashboard_access(
    host: str, *, token: str | None, allowed_hosts: Iterable[str] = (), no_auth: bool = False
) -> Access:
    """Who may use a dashboard listening on ``host`` (pure but for the machine's name).

    It answers for the local names, the address it listens on (for a wildcard
    address, ``0.0.0.0`` or ``::``, the machine's host name and fully qualified name)
    and ``allowed_hosts`` (``*``: any host), and for the address a client connected
    to. It needs ``token``, unless ``no_auth``.

    Error handling:
        :class:`~streamkit.ConfigError` when it listens on an address other machines
        can reach without a token and without ``no_auth``, or for a short token.
    """
    check_token("token", token)
    if no_auth:
        token = None
    elif token is None and not is_loopback(host):
        raise ConfigError(
            "token",
            f"the dashboard would listen on {host}, which other machines can reach: give "
            f"it a token (--token or STREAMKIT_DASHBOARD_TOKEN), or pass --no-auth to "
            f"show it to anyone who can reach it",
        )
    names = {*LOCAL_NAMES, *(host_name(given) for given in allowed_hosts)}
    bound = host.strip("[]").lower()
    if bound in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(bound)
    return Access(
        token=token,
        allowed_hosts=None if "*" in names else frozenset(names),
        browser_login=True,
        what="the dashboard",
    )


@attrs.define(eq=False)
class Dashboard:
    """The dashboard's ASGI application: ``await nursery.start(dashboard.sample, 1.0)``
    keeps its reading fresh; hand the object to an ASGI server.

    Attributes:
        app: the app shown (entered: ``async with app``).
        latest: the newest reading, or ``None`` before the first.
    """

    app: App
    latest: FleetSample | None = None
    #: Whether the job queue's controls are on (see :func:`run_dashboard`).
    actions: bool = True
    #: What is paused on the job queue, as last read.
    paused: list[str] = attrs.field(factory=list)
    #: The anti-forgery token of this dashboard's pages (new at each start).
    csrf: str = attrs.field(factory=lambda: secrets.token_urlsafe(24), repr=False)
    _page: bytes = attrs.field(init=False, factory=_page)
    _policy: bytes = attrs.field(init=False)

    @_policy.default
    def _page_policy(self) -> bytes:
        return page_policy(self._page).encode()

    async def sample(self, interval: float, *, task_status: trio.TaskStatus[None]) -> None:
        """Read the app's status every ``interval`` seconds, until cancelled.

        ``nursery.start`` returns once the first reading is in (failed or not).
        """
        started = False
        async with contextlib.aclosing(fleet_samples(self.app, interval=interval)) as samples:
            async for sample in samples:
                self.latest = sample
                if sample.error is not None:
                    log.warning("reading the status failed: %s", sample.error)
                elif self.app.jobs:
                    try:
                        self.paused = await self.app.job_queue.paused()
                    except StreamkitError as exc:
                        log.warning("reading what is paused failed: %s", exc)
                if not started:
                    task_status.started()
                    started = True

    def status_json(self) -> dict[str, Any]:
        """What ``/api/status`` answers."""
        controls = {"actions": self.actions, "paused": self.paused, "csrf": self.csrf}
        sample = self.latest
        if sample is None or sample.snapshot is None:
            error = sample.error if sample is not None else "no reading yet"
            return {
                "app": self.app.name,
                "error": error,
                "processors": [],
                "jobs": None,
                "controls": controls,
            }
        return {
            **fleet_json(sample.snapshot, sample.rates),
            "error": sample.error,
            "controls": controls,
        }

    async def act(self, path: str) -> tuple[int, dict[str, Any]]:
        """Do what a POST to ``path`` asks (see the module): an HTTP status and a JSON
        body."""
        if not self.app.jobs:
            return 404, {"error": f"app {self.app.name} declares no jobs"}
        queue = self.app.job_queue
        try:
            if path.startswith(_JOB_PREFIX) and path.rpartition("/")[2] in _ACTIONS:
                job_id, _, action = path.removeprefix(_JOB_PREFIX).rpartition("/")
                job_id = urllib.parse.unquote(job_id)
                queue = await app_job_queue_of(self.app, job_id)
                if action == "abort":
                    status = await queue.abort(job_id, "aborted from the dashboard")
                    return 200, {"job": job_id, "status": status.value}
                act = queue.replay if action == "replay" else queue.purge
                done = await act([job_id])
                if not done:
                    return 409, {"error": f"job {job_id} is not dead: nothing to {action}"}
                return 200, {"job": job_id, action: True}
            for verb in ("pause", "resume"):
                if path == f"/api/{verb}" or path.startswith(f"/api/{verb}/"):
                    name = urllib.parse.unquote(path.removeprefix(f"/api/{verb}").lstrip("/"))
                    if verb == "pause":
                        await queue.pause(name or None)
                    else:
                        await queue.resume(name or None)
                    self.paused = await queue.paused()
                    return 200, {"paused": self.paused}
        except JobNotFound as exc:
            return 404, {"error": str(exc)}
        except ConfigError as exc:
            return 400, {"error": str(exc)}
        except StreamkitError as exc:
            return 503, {"error": str(exc)}
        return 404, {"error": f"no action {path}"}

    async def job_json(self, job_id: str) -> tuple[int, dict[str, Any]]:
        """What ``/api/jobs/ID`` answers: an HTTP status and a JSON body."""
        if not self.app.jobs:
            return 404, {"error": f"app {self.app.name} declares no jobs"}
        if not job_id:
            return 404, {"error": "no job id"}
        try:
            queue = await app_job_queue_of(self.app, job_id)
            info = await queue.info(job_id)
        except JobNotFound as exc:
            return 404, {"error": str(exc)}
        except StreamkitError as exc:
            return 503, {"error": str(exc)}
        return 200, job_json(info)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        headers_in: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers_in.setdefault(name.lower(), value)
        acting = scope["method"] == "POST" and (
            path.startswith(("/api/pause", "/api/resume"))
            or (path.startswith(_JOB_PREFIX) and path.rpartition("/")[2] in _ACTIONS)
        )
        if acting and not self.actions:
            status, body, kind = 403, orjson.dumps({"error": "read-only: actions are off"}), "json"
        elif acting and (why := forged(headers_in, self.csrf)) is not None:
            log.warning("refused %s %s: %s", scope["method"], path, why)
            status, body, kind = 403, orjson.dumps({"error": f"refused: {why}"}), "json"
        elif acting:
            status, data = await self.act(path)
            body, kind = orjson.dumps(data), "json"
            log.info("%s %s: %s", scope["method"], path, status)
        elif scope["method"] not in ("GET", "HEAD"):
            status, body, kind = 405, orjson.dumps({"error": "GET only here"}), "json"
        elif path in ("/", "/index.html"):
            status, body, kind = 200, self._page, "html"
        elif path == "/api/status":
            status, body, kind = 200, orjson.dumps(self.status_json()), "json"
        elif path.startswith(_JOB_PREFIX):
            status, data = await self.job_json(path.removeprefix(_JOB_PREFIX))
            body, kind = orjson.dumps(data), "json"
        else:
            status, body, kind = 404, orjson.dumps({"error": f"no page {path}"}), "json"
        content_type = b"text/html; charset=utf-8" if kind == "html" else b"application/json"
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        if kind == "html":
            headers.append((b"content-security-policy", self._policy))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {
                "type": "http.response.body",
                "body": b"" if scope["method"] == "HEAD" else body,
                "more_body": False,
            }
        )


async def run_dashboard(
    app: App,
    *,
    host: str,
    port: int,
    interval: float = 1.0,
    access: Access,
    on_serving: Callable[[str], object] = lambda url: None,
) -> None:
    """Serve ``app``'s dashboard on ``host:port`` until SIGINT or SIGTERM, to the
    requests ``access`` lets through (see :func:`dashboard_access`). Its actions are on
    when it has a token or listens on this machine only.

    ``on_serving`` gets the URL once the first reading is in and the server accepts
    connections.

    Error handling:
        :class:`~streamkit.ConfigError` if the port cannot be bound;
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached at the start.
    """
    async with (
        until_signal(),
        app,
        open_service_nursery(reason="the dashboard stopping") as nursery,
    ):
        # The job queue's controls: behind its token, or for this machine's users; a
        # dashboard shown to anyone (--no-auth on a reachable address) only shows.
        dashboard = Dashboard(app, actions=access.token is not None or is_loopback(host))
        await nursery.start(dashboard.sample, interval)
        url: str = await nursery.start(
            lambda task_status: serve_asgi(
                guarded(dashboard, access),
                host=host,
                port=port,
                what="the dashboard",
                task_status=task_status,
            )
        )
        on_serving(url)
        await trio.sleep_forever()
