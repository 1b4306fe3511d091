"""The dashboard's JSON API: ``GET /pathdask/api/<view>``, one tornado handler per view.

Each answer is the same data its page plots (:mod:`.views`). A request marks the
dashboard as watched and waits (briefly) for a fresh pull from the hosts.
"""

from __future__ import annotations

from typing import Any

from distributed.http.utils import RequestHandler
from tornado import web

from . import views

#: how long a request waits for a fresh pull before it answers from the record as it is
FRESH_TIMEOUT = 2.0


def root_path(prefix: str) -> str:
    """The dashboard's root path for a Dask prefix: ``"/"``, or ``"/dask/"`` for ``"dask"``."""
    inner = prefix.strip("/")
    return f"/{inner}/" if inner else "/"


def plugin_of(scheduler: Any) -> Any:
    """The scheduler's pathdask plugin (``None`` while it is not installed)."""
    return scheduler.plugins.get("pathdask")


class ViewHandler(RequestHandler):
    """``GET /pathdask/api/<view>``; ``timeline`` takes ``?since=<epoch seconds>&limit=<n>``."""

    async def get(self, view: str) -> None:
        plugin = plugin_of(self.server)
        if plugin is None:
            self.set_status(503)
            self.write({"error": "the pathdask scheduler plugin is not installed"})
            return
        collector = plugin.activity
        collector.watch()
        if view in ("timeline", "memory", "links", "queue"):
            await collector.refresh(max_age=collector.interval, timeout=FRESH_TIMEOUT)
        record = collector.record
        if view == "timeline":
            since, limit = self._number("since", float), self._number("limit", int)
            out = views.timeline(record, since, limit)
        elif view == "memory":
            out = views.memory(record)
        elif view == "links":
            out = views.links(record)
        elif view == "queue":
            out = views.queue(plugin, record, collector.window)
        else:
            out = views.resources(plugin)
        self.write(out)


    def _number(self, name: str, kind: type[float] | type[int]) -> Any:
        text = self.get_argument(name, None)
        try:
            return None if text in (None, "") else kind(text)
        except ValueError:
            raise web.HTTPError(400, reason=f"{name} must be a number ({kind.__name__}), got {text!r}") from None


def routes(prefix: str) -> list[tuple[str, type, dict[str, Any]]]:
    """(pattern, handler, kwargs) for the scheduler's HTTP application, under ``prefix``."""
    return [(f"{prefix}pathdask/api/({'|'.join(views.VIEWS)})/?", ViewHandler, {})]
