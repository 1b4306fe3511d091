"""Adds the dashboard's pages, its JSON API and its menu entries to a running scheduler.

Called from the scheduler plugin's ``start``, so it works however the plugin
came (``LocalSystem``, ``dask scheduler --preload pathdask.preload``, or
``Client.register_plugin``). The pages get a Bokeh application of their own on
the scheduler's HTTP server; every use of Dask's dashboard internals that this
takes is in :mod:`pathdask.compat`.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from tornado import web

from ..compat import add_bokeh_application, add_http_handlers, dashboard_application
from . import api
from .api import root_path

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.dashboard")

_installed: weakref.WeakSet[Any] = weakref.WeakSet()


def install(scheduler: Scheduler) -> None:
    """Serve ``/pathdask/api/<view>`` and, where the scheduler has a dashboard, the pages
    ``/pathdask/<view>``, listed in its "More..." menu. Once per scheduler."""
    if scheduler in _installed:
        return
    dashboard = dashboard_application(scheduler)
    prefix = root_path(dashboard.prefix if dashboard is not None else "")
    # Dask's pages link their styles relative to where they are; ours are one folder down.
    statics = [(f"{prefix}pathdask/statics/(.*)", web.RedirectHandler, {"url": f"{prefix}statics/{{0}}"})]
    handlers = [(pattern, cls, {"dask_server": scheduler, **kwargs})
                for pattern, cls, kwargs in api.routes(prefix)]
    if not add_http_handlers(scheduler, handlers + statics):
        return  # no HTTP server
    _installed.add(scheduler)
    if dashboard is None:
        return
    _add_pages(scheduler, prefix)


def _add_pages(scheduler: Scheduler, prefix: str) -> None:
    from .pages import PAGES, applications  # Bokeh's server parts load only with a dashboard

    add_bokeh_application(scheduler, applications(), prefix,
                          [{"url": path, "name": name} for path, (name, _) in PAGES.items()])
    logger.info("pathdask: dashboard pages at %spathdask/{%s}", prefix,
                ",".join(p.split("/")[1] for p in PAGES))
