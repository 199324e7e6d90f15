"""Where Prometheus reads a server's metrics: `GET /metrics` on the HTTP port (`metrics_route`)
and on the metrics listener (`metrics_listener`, TRITONACTOR_METRICS_HOST/_PORT, 8002 by
default, as Triton). Each keeps its own `ServerMetrics` over the same server."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketListener
from prometheus_client import CollectorRegistry, ProcessCollector
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tritonactor.cache import caches_responses
from tritonactor.frontends.listen import ListenFailed, address_text, listening_socket
from tritonactor.observability.exposition import CONTENT_TYPE, render
from tritonactor.observability.gpu import GpuMetrics
from tritonactor.observability.metrics import MailboxSample, MetricsCollector, VersionSample
from tritonactor.observability.summaries import SummarySample

if TYPE_CHECKING:
    from tritonactor.server import Server

log = logging.getLogger(__name__)


class JournalTally:
    """Event counts by type, and the latest load time of each version, from the control-plane
    journal: each scrape reads only what was appended since the one before."""

    PAGE = 1000

    def __init__(self) -> None:
        self._seq = 0
        self.counts: Mapping[str, int] = {}
        self.load_seconds: Mapping[tuple[str, int], float] = {}
        self._lock = threading.Lock()  # two scrapes at once read the journal one after the other

    def catch_up(self, journal: Any) -> None:
        """Read what `journal` (a control.journal.Journal) gained. Blocking: run it off the loop.
        The tallies are replaced, never changed in place, so the loop reads a whole one."""
        with self._lock:
            seq = self._seq
            counts = dict(self.counts)
            loads = dict(self.load_seconds)
            if journal.last_seq < seq:  # a new file: the old one was set aside as corrupt
                seq, counts, loads = 0, {}, {}
            try:
                while entries := journal.page(seq, self.PAGE):
                    for entry in entries:
                        event = entry.event
                        # A journal record's type is its event's class name (control/journal.py).
                        kind = type(event).__name__
                        counts[kind] = counts.get(kind, 0) + 1
                        if kind == "ModelLoaded":
                            loads[(event.model, event.version)] = event.load_seconds
                    seq = entries[-1].seq
            except ValueError as error:  # a record this server cannot read: the next scrape retries
                log.warning("metrics: cannot read the journal past seq %d: %s", seq, error)
            self._seq, self.counts, self.load_seconds = seq, counts, loads


def _settle(summaries: list[SummarySample]) -> None:
    for summary in summaries:
        summary.settle()


class ServerMetrics:
    """One server's registry: the collector reads the server's router and journal at each
    scrape, plus this process (prometheus_client's process collector)."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._journal = JournalTally()
        self.registry = CollectorRegistry(auto_describe=False)
        # The versions' samples while a scrape renders them (`render`).
        self._versions: list[VersionSample] | None = None
        settings = server.settings
        self._collector = MetricsCollector(
            self,
            cpu_metrics=settings.cpu_metrics_enabled,
            gpu_metrics=settings.gpu_metrics_enabled,
            response_cache=cache.sample if (cache := server.router.cache) is not None else None,
            latency=server.latency,
        )
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)
        self._gpu_looked_for = False

    async def render(self) -> bytes:
        """The text Prometheus scrapes."""
        await anyio.to_thread.run_sync(self._prepare)
        # The versions read on the loop; their summaries' quantiles (a sort of up to a minute's
        # durations each) computed on a worker thread, from copies.
        versions = self._read_versions()
        summaries = [s for v in versions if v.summaries for s in v.summaries.values()]
        if summaries:
            await anyio.to_thread.run_sync(_settle, summaries)
        self._versions = versions
        try:
            return render(self.registry)
        finally:
            self._versions = None

    def _prepare(self) -> None:
        # Off the loop: NVML's start and the journal's reading both block.
        if not self._gpu_looked_for and self._collector.gpu_metrics:
            self._gpu_looked_for = True
            self._collector.gpu = GpuMetrics.open()
        journal = self._server.journal
        if journal is not None:
            self._journal.catch_up(journal)

    # -- the MetricsSource ---------------------------------------------------------------------

    def versions(self) -> Iterable[VersionSample]:
        return self._versions if self._versions is not None else self._read_versions()

    def _read_versions(self) -> list[VersionSample]:
        return [
            handle.statistics.sample(
                handle.name, handle.version, response_cache=caches_responses(handle.config)
            )
            for handle in self._server.router.handles()
        ]

    def load_seconds(self) -> Mapping[tuple[str, int], float]:
        loads = self._journal.load_seconds
        ready = ((handle.name, handle.version) for handle in self._server.router.handles())
        return {key: loads[key] for key in ready if key in loads}

    def journal_events(self) -> Mapping[str, int]:
        return self._journal.counts

    def mailboxes(self) -> Iterable[MailboxSample]:
        """Every actor of the tree: the manager, the repository watcher (poll mode), each
        model-version actor and its scheduler and instances (a version actor is named
        `<model>:<version>`)."""
        manager = self._server.manager
        if manager is None:
            return []
        samples = [MailboxSample(manager.name, "", "", manager.mailbox_depth)]
        watcher = self._server.watcher
        if watcher is not None:
            samples.append(MailboxSample(watcher.name, "", "", watcher.mailbox_depth))
        for version_actor in manager.children:
            model, _, version = version_actor.name.rpartition(":")
            samples.append(MailboxSample("version", model, version, version_actor.mailbox_depth))
            for child in version_actor.children:
                # A version's scheduler is named after its model; instances by their own names.
                actor = "scheduler" if child.name == model else child.name
                samples.append(MailboxSample(actor, model, version, child.mailbox_depth))
        return samples


def metrics_route(server: Server) -> Route:
    """`GET /metrics` for the HTTP app (404 when metrics are disabled, as the listener is); in
    a front-end process (a server with `render_metrics`) the engine renders them."""
    render = getattr(server, "render_metrics", None) or ServerMetrics(server).render

    async def endpoint(request: Request) -> Response:
        if not server.settings.metrics_enabled:
            raise HTTPException(404)
        return Response(await render(), media_type=CONTENT_TYPE)

    return Route("/metrics", endpoint, methods=["GET"])


# -- the metrics listener --------------------------------------------------------------------------

# What a scraper may take to send its request, and the most a request's head may hold.
READ_TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 16 * 1024


@asynccontextmanager
async def metrics_listener(server: Server) -> AsyncIterator[int | None]:
    """Serve `GET /metrics` on the metrics host and port while the block runs; yields the port
    it listens on (the one the OS chose for port 0), or None when metrics are disabled."""
    settings = server.settings
    if not settings.metrics_enabled:
        yield None
        return
    # One process serves metrics (the engine, or the one process): bound once, never shared
    # with another process (frontends/listen.py). Plain HTTP, as Triton's; docs/tls.md.
    try:
        sock = listening_socket("metrics", settings.metrics_host, settings.metrics_port)
    except ListenFailed as error:
        log.error("%s", error)
        raise
    listener = await SocketListener.from_socket(sock)
    port = listener.extra(SocketAttribute.local_port)
    log.info("Started Metrics Service at %s", address_text(settings.metrics_host, port))
    try:
        async with anyio.create_task_group() as group:
            render = ServerMetrics(server).render
            group.start_soon(listener.serve, functools.partial(_answer, render))
            try:
                yield port
            finally:
                group.cancel_scope.cancel()
    finally:
        await listener.aclose()


class _BadRequest(Exception):
    pass


async def _answer(render: Callable[[], Awaitable[bytes]], stream: ByteStream) -> None:
    """One connection, one request: HTTP/1.1 without keep-alive, which scrapers handle."""
    async with stream:
        try:
            with anyio.fail_after(READ_TIMEOUT_SECONDS):
                method, path = await _read_request_line(stream)
            if path != "/metrics":
                response = _response(404, b"Not Found\n", "text/plain; charset=utf-8")
            elif method != "GET":
                response = _response(405, b"Method Not Allowed\n", "text/plain; charset=utf-8")
            else:
                response = _response(200, await render(), CONTENT_TYPE)
        except _BadRequest:
            response = _response(400, b"Bad Request\n", "text/plain; charset=utf-8")
        except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return  # the scraper went away or never spoke
        except Exception:
            log.exception("metrics: a scrape failed")
            response = _response(500, b"Internal Server Error\n", "text/plain; charset=utf-8")
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await stream.send(response)


async def _read_request_line(stream: ByteStream) -> tuple[str, str]:
    """The method and path of the request, once its whole head has arrived."""
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_HEAD_BYTES:
            raise _BadRequest
        head += await stream.receive()
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        raise _BadRequest
    return parts[0].decode("latin-1"), parts[1].decode("latin-1").split("?", 1)[0]


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


def _response(status: int, body: bytes, content_type: str) -> bytes:
    allow = "Allow: GET\r\n" if status == 405 else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{allow}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
