"""Serving the metrics: ``rundispatch --metrics-port`` endpoints and the Django view.

What is counted, and where, is ``metrics``; this module only exposes it:
one process's endpoint (``serve_single``), the ``--processes`` supervisor's
endpoint summing its children through prometheus_client's multiprocess mode
(``serve_multiprocess``), and the body of ``django_dispatch.views.metrics``
(``render_view``, the cluster gauges cached for ``VIEW_CACHE_SECONDS``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from .metrics import (
    ALL_INTERFACES,
    MULTIPROC_ENV,
    VIEW_CACHE_SECONDS,
    ClusterCollector,
    ClusterSnapshot,
    FileSink,
    MemorySink,
    cluster_snapshot,
    enable_worker,
)


def _dispatch_only(source: Any) -> Any:
    """A collector yielding only ``source``'s ``dispatch_*`` families."""

    class DispatchOnly:
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> Iterator[Any]:
            for family in source.collect():
                if family.name.startswith("dispatch_"):
                    yield family

    return DispatchOnly()


def _process_source() -> Any:
    """This process's values, or every process's in multiprocess mode."""
    from prometheus_client import REGISTRY

    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        from prometheus_client.multiprocess import MultiProcessCollector

        return MultiProcessCollector(None, path=directory)
    return REGISTRY


class Server:
    """A metrics endpoint started by ``rundispatch --metrics-port``."""

    def __init__(self, httpd: Any, thread: threading.Thread, directory: str | None, owned: bool):
        self.httpd = httpd
        self.thread = thread
        self.directory = directory  # multiprocess mode
        self.owned = owned  # we made the directory, and remove it

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def in_child(self) -> None:
        """In a forked child: drop the inherited listening socket, count into the directory."""
        with contextlib.suppress(OSError):
            self.httpd.socket.close()
        assert self.directory is not None
        enable_worker(FileSink(self.directory))

    def child_exited(self, pid: int) -> None:
        """A child exited: its live gauges (slots) stop counting."""
        from prometheus_client import multiprocess

        if self.directory is not None:
            multiprocess.mark_process_dead(pid, self.directory)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.owned and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def serve_single(port: int, addr: str = "") -> Server:
    """One worker process: serve its metrics and the cluster gauges while it leads."""
    from prometheus_client import CollectorRegistry, start_http_server

    sink = MemorySink()
    enable_worker(sink)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_dispatch_only(_process_source()))
    registry.register(ClusterCollector(sink.read))
    httpd, thread = start_http_server(port, addr or ALL_INTERFACES, registry=registry)
    return Server(httpd, thread, None, owned=False)


def serve_multiprocess(port: int, addr: str = "") -> Server:
    """The ``--processes`` supervisor, before it forks: one endpoint for all children."""
    from prometheus_client import CollectorRegistry, start_http_server, values
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = os.environ.get(MULTIPROC_ENV)
    owned = not directory
    if not directory:
        directory = tempfile.mkdtemp(prefix="dispatch-metrics-")
        os.environ[MULTIPROC_ENV] = directory
    if values.ValueClass is values.MutexValue:
        # prometheus_client was imported before the variable was set (by the
        # project's settings, say): values made from now on go to files.
        values.ValueClass = values.MultiProcessValue()
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=directory)
    registry.register(ClusterCollector(FileSink(directory).read))
    try:
        httpd, thread = start_http_server(port, addr or ALL_INTERFACES, registry=registry)
    except BaseException:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return Server(httpd, thread, directory, owned=owned)


def resume_after_recycle(port: int, addr: str, child: int | None) -> Server | None:
    """A worker that re-executed itself: serve again (one process) or count into the
    supervisor's directory (a ``--processes`` child, whose supervisor still serves)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if child is not None and directory:
        enable_worker(FileSink(directory))
        return None
    return serve_single(port, addr)


# --- the Django view --------------------------------------------------------------------

_view_registry: Any = None
_view_cache: tuple[float, ClusterSnapshot | None] = (0.0, None)
_view_lock = threading.Lock()


def _view_cluster() -> ClusterSnapshot | None:
    """The cluster snapshot, read at most once per ``VIEW_CACHE_SECONDS`` per process."""
    global _view_cache
    from ..conf import get_settings

    with _view_lock:
        read_at, snapshot = _view_cache
        if snapshot is None or time.monotonic() - read_at > VIEW_CACHE_SECONDS:
            cfg = get_settings()
            snapshot = cluster_snapshot(
                max_age=VIEW_CACHE_SECONDS + 60.0, live_within=cfg.LEASE_SECONDS
            )
            _view_cache = (time.monotonic(), snapshot)
        return snapshot


def forget_view_cache() -> None:
    global _view_cache
    with _view_lock:
        _view_cache = (0.0, None)


def render_view(accept: str | None) -> tuple[bytes, str]:
    """The metrics view's body and content type: cluster gauges and this process's
    (or, in multiprocess mode, every process's) ``dispatch_*`` metrics."""
    global _view_registry
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    if _view_registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_dispatch_only(_process_source()))
        registry.register(ClusterCollector(_view_cluster))
        _view_registry = registry
    encoder, content_type = choose_encoder(accept or "")
    return encoder(_view_registry), content_type
