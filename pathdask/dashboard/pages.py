"""The Bokeh documents of the dashboard's pages, ``/pathdask/<view>``.

Each page is one :mod:`.components` plot in Dask's own page template (its
navigation bar and "More..." menu), updated by a periodic callback on the
scheduler's event loop, as Dask's own pages are.
"""

from __future__ import annotations

from typing import Any

from ..compat import dashboard_page_parts
from .api import plugin_of, root_path
from .components import Component, Links, Memory, Queue, Resources, Timeline

#: how often an open page redraws from the record, in milliseconds
UPDATE_MS = 500

#: page path (under the dashboard's prefix) -> (menu name, component)
PAGES: dict[str, tuple[str, type[Component]]] = {
    "pathdask/timeline": ("Pathdask Timeline", Timeline),
    "pathdask/memory": ("Pathdask Memory", Memory),
    "pathdask/links": ("Pathdask Links", Links),
    "pathdask/queue": ("Pathdask Queue", Queue),
    "pathdask/resources": ("Pathdask Resources", Resources),
}

# The pages sit one folder down, and Dask's template links its styles, pages and menu
# relative to the dashboard's root: a <base> makes them resolve from there.
TEMPLATE = """{% extends "simple.html" %}
{% block resources %}<base href="{{ pathdask_base }}">
{{ super() }}{% endblock %}
"""


def make_doc(name: str, cls: type[Component]) -> Any:
    """The Bokeh document function ``(scheduler, extra, doc)`` of one page."""

    def doc_function(scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
        add_periodic_callback, theme, env = dashboard_page_parts()
        plugin = plugin_of(scheduler)
        if plugin is None:
            raise RuntimeError("the pathdask scheduler plugin is not installed on this scheduler")
        component = cls(plugin, sizing_mode="stretch_width")
        component.update()
        add_periodic_callback(doc, component, UPDATE_MS)
        doc.add_root(component.root)
        doc.title = f"Dask: {name}"
        doc.template = env.from_string(TEMPLATE)
        doc.template_variables.update(extra)
        doc.template_variables["pathdask_base"] = root_path(extra.get("prefix", ""))
        doc.theme = theme

    return doc_function


def applications() -> dict[str, Any]:
    """Page path -> document function, for :func:`pathdask.compat.add_bokeh_application`."""
    return {f"/{path}": make_doc(name, cls) for path, (name, cls) in PAGES.items()}
