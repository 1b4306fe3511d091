"""Adds the dashboard's pages, its JSON API and its menu entries to a running scheduler.

Called from the scheduler plugin's ``start``, so it works however the plugin
came (``LocalSystem``, ``dask scheduler --preload pathdask.preload``, or
``Client.register_plugin``): Dask's ``applications`` mapping is read only when
the HTTP server starts, so the pages get a Bokeh application of their own on
the same server, as ``distributed.dashboard.scheduler.connect`` makes Dask's.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from tornado import web
from tornado.ioloop import IOLoop

from . import api

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.dashboard")

_installed: weakref.WeakSet[Any] = weakref.WeakSet()


def root_path(prefix: str) -> str:
    """The dashboard's root path for a Dask prefix: ``"/"``, or ``"/dask/"`` for ``"dask"``."""
    inner = prefix.strip("/")
    return f"/{inner}/" if inner else "/"


def _dask_dashboard(scheduler: Scheduler) -> Any:
    """Dask's own Bokeh application on this scheduler, or ``None`` without a dashboard."""
    try:
        from bokeh.server.server import BokehTornado
    except ImportError:
        return None
    for app in getattr(scheduler.http_application, "applications", ()):
        if isinstance(app, BokehTornado):
            return app
    return None


def install(scheduler: Scheduler) -> None:
    """Serve ``/pathdask/api/<view>`` and, where the scheduler has a dashboard, the pages
    ``/pathdask/<view>``, listed in its "More..." menu. Once per scheduler."""
    if scheduler in _installed or getattr(scheduler, "http_application", None) is None:
        return
    _installed.add(scheduler)
    dashboard = _dask_dashboard(scheduler)
    prefix = root_path(dashboard.prefix if dashboard is not None else "")
    # Dask's pages link their styles relative to where they are; ours are one folder down.
    statics = [(f"{prefix}pathdask/statics/(.*)", web.RedirectHandler, {"url": f"{prefix}statics/{{0}}"})]
    scheduler.http_application.add_handlers(r".*", [
        (pattern, cls, {"dask_server": scheduler, **kwargs}) for pattern, cls, kwargs in api.routes(prefix)
    ] + statics)
    if dashboard is None:
        return
    _add_pages(scheduler, prefix)


def _add_pages(scheduler: Scheduler, prefix: str) -> None:
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables

    from .pages import PAGES, applications  # Bokeh's server parts load only with a dashboard

    variables = template_variables(scheduler)  # memoized: the dict Dask's own pages render with
    listed = {p["url"] for p in variables["plots"]}
    variables["plots"].extend({"url": path, "name": name} for path, (name, _) in PAGES.items()
                              if path not in listed)
    variables["plots"].sort(key=lambda p: p["name"])
    app = BokehApplication(applications(), scheduler, prefix=prefix, template_variables=variables)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    logger.info("pathdask: dashboard pages at %spathdask/{%s}", prefix,
                ",".join(p.split("/")[1] for p in PAGES))
