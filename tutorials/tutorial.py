"""What the tutorial notebooks share: links to pathdask's dashboard pages.

Notebooks import it as ``from tutorial import ...``; they run from this folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin

__all__ = ["PAGES", "dashboard_pages"]

#: pathdask's pages on the Dask dashboard, under ``/pathdask/<page>``
PAGES = ("timeline", "memory", "links", "queue", "resources")


def dashboard_pages(dashboard_link: str | None, pages: Sequence[str] = PAGES) -> Any:
    """Links to pathdask's dashboard ``pages`` on the dashboard at ``dashboard_link``, as Markdown.

    ``dashboard_link`` is ``system.dashboard_link`` (or a Dask client's); ``None``
    means the system runs without a dashboard.
    """
    from IPython.display import Markdown

    if not dashboard_link:
        return Markdown("This system runs without a dashboard.")
    rows = [f"- [{page}]({urljoin(dashboard_link, f'/pathdask/{page}')})" for page in pages]
    return Markdown("\n".join([f"Dask's dashboard: <{dashboard_link}>; pathdask's pages:", *rows]))

