"""The dashboard's pages in a real browser (Debian's chromium, driven by Playwright) while tenants run.

Skipped when chromium is absent, unless ``PATHDASK_REQUIRE_BROWSER=1`` (as CI sets):
then it fails. ``PATHDASK_SCREENSHOTS=DIR`` also saves each page's screenshot
there (the README's picture of the timeline comes from it).
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pathdask as pw
from pathdask.bench.dashboard import TENANTS, Workload, recorded
from pathdask.dashboard.views import VIEWS

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

# Rows of every ColumnDataSource of the page's Bokeh document, by the data source's id.
ROWS_JS = """() => {
  const rows = {};
  for (const m of Bokeh.documents[0].all_models) {
    if (m.type === "ColumnDataSource" || m.constructor.__name__ === "ColumnDataSource") {
      const cols = Object.keys(m.data);
      rows[m.id] = cols.length ? m.data[cols[0]].length : 0;
    }
  }
  return rows;
}"""


def _browser_or_skip() -> None:
    if os.path.exists(CHROMIUM):
        return
    reason = f"no chromium at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("PATHDASK_REQUIRE_BROWSER") == "1":
        pytest.fail(f"PATHDASK_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def distinct_colours(png: bytes) -> int:
    """Distinct RGB colours of a PNG screenshot (Bokeh's canvas included)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    return len(np.unique(pixels[:: max(1, len(pixels) // 200_000)], axis=0))


@pytest.fixture(scope="module")
def busy_system() -> Iterator[tuple[str, Workload]]:
    """One system with its dashboard on, three tenants working meanwhile; yields the dashboard's
    root and the tenants."""
    _browser_or_skip()
    with pw.LocalSystem(processes=False) as system:
        assert system.dashboard_link is not None
        with Workload(system, TENANTS) as work:
            assert work.ready.wait(60)
            yield system.dashboard_link.rsplit("/", 1)[0], work


@pytest.fixture(scope="module")
def browser(busy_system: tuple[str, Workload]) -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("view", VIEWS)
def test_page_draws_live_data_without_errors(view: str, busy_system: tuple[str, Workload], browser: Any) -> None:
    root, work = busy_system
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    try:
        start = time.perf_counter()
        page.goto(f"{root}/pathdask/{view}")
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0", timeout=30_000)
        # every data source has rows once the first periodic update came (0.5 s)
        page.wait_for_function(f"() => Object.values(({ROWS_JS})()).every(n => n > 0)", timeout=30_000)
        print(f"/pathdask/{view}: drawn with data in {time.perf_counter() - start:.2f}s")
        rows = page.evaluate(ROWS_JS)
        assert rows and all(n > 0 for n in rows.values()), rows
        if view == "timeline":  # live: new gangs stream in while the tenants run
            first, calls = max(rows.values()), sum(work.calls.values())
            try:
                page.wait_for_function(f"() => Math.max(...Object.values(({ROWS_JS})())) > {first}",
                                       timeout=60_000)
            except Exception as e:  # which side stood still: the tenants, or the pulls and the page
                raise AssertionError(f"no new gang drawn in 60 s: {first} rows; the tenants made "
                                     f"{sum(work.calls.values()) - calls} calls meanwhile; "
                                     f"{recorded(root)} gangs recorded") from e
        png = page.screenshot()
        assert distinct_colours(png) > 8, "the page looks blank"
        folder = os.environ.get("PATHDASK_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"dashboard-{view}.png").write_bytes(png)
        assert not problems, problems
    finally:
        page.close()
