"""HTML pieces for notebook reprs, in the style of Dask's cluster and client reprs.

Plain tables and inline SVG, with inline styles and no external assets, so that
a repr renders the same in Jupyter, in VS Code and in a saved notebook. Every
text that comes from outside is escaped here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Cell", "Raw", "card", "columns", "details", "grid_svg", "host_label", "link", "table"]

#: fill colours of grid cells, one per host (cycled), soft enough for black text
PALETTE = ("#ECB172", "#A6CEE3", "#B2DF8A", "#FB9A99", "#CAB2D6", "#FDBF6F", "#FFFF99", "#8DD3C7")
CELL_W, CELL_H = 76, 40
TH = "text-align: left; padding: 2px 10px 2px 0px;"
TD = "text-align: left; padding: 2px 10px 2px 0px;"
#: a grid larger than this is summarised in words rather than drawn
MAX_CELLS = 256


def esc(value: Any) -> str:
    return html.escape(str(value))


def host_label(device: Any) -> str:
    """``i0h1``: island 0, host 1 (the same short form as ``Mesh``'s repr)."""
    return f"i{device.island}h{device.host}"


class Raw(str):
    """Text that is HTML already: tables do not escape it."""


def link(url: str) -> Raw:
    return Raw(f'<a href="{esc(url)}" target="_blank">{esc(url)}</a>')


def _cell(value: Any) -> str:
    return value if isinstance(value, Raw) else esc(value)


def table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of ``(label, value)``."""
    body = "".join(
        f'<tr><th style="{TH}">{esc(k)}</th><td style="{TD}">{_cell(v)}</td></tr>'
        for k, v in rows
    )
    return f'<table style="border-collapse: collapse;">{body}</table>'


def columns(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table with a header row."""
    head = "".join(f'<th style="{TH}">{esc(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{TD}">{_cell(c)}</td>' for c in r) + "</tr>"
                   for r in rows)
    return f'<table style="border-collapse: collapse;"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def details(summary: str, body: str, open_: bool = False) -> str:
    """A collapsible section, as Dask's cluster repr has for its scheduler info."""
    return (f'<details{" open" if open_ else ""}><summary style="margin-bottom: 8px;">'
            f'<strong>{esc(summary)}</strong></summary>{body}</details>')


def card(kind: str, name: str, body: str, side: str = "") -> str:
    """Dask's repr layout: a small square, a heading and a subtitle, then ``body``.

    ``side`` (a drawing) goes to the right of the body, as in dask.array's repr.
    """
    right = f'<td style="vertical-align: top; padding-left: 16px;">{side}</td>' if side else ""
    return (
        '<div class="pathdask-repr">'
        '<div style="width: 24px; height: 24px; background-color: #ECB172; border: 3px solid #9D9D9D; '
        'border-radius: 5px; position: absolute;"></div>'
        '<div style="margin-left: 48px;">'
        f'<h3 style="margin-bottom: 0px; margin-top: 0px;">{esc(kind)}</h3>'
        f'<p style="color: #9D9D9D; margin-bottom: 0px;">{esc(name)}</p>'
        f'<table><tr><td style="vertical-align: top;">{body}</td>{right}</tr></table>'
        "</div></div>"
    )


@dataclass(frozen=True)
class Cell:
    """One cell of a grid drawing: its text lines, a colour group (a host) and a tooltip."""

    lines: tuple[str, ...]
    group: int
    title: str


def grid_svg(cells: Sequence[Sequence[Cell]], caption: str = "") -> str:
    """Cells in rows as an SVG grid, coloured by group, like dask.array's chunk diagram."""
    n_rows, n_cols = len(cells), max((len(r) for r in cells), default=0)
    if n_rows * n_cols > MAX_CELLS:
        return f"<p>{n_rows} x {n_cols} cells: too many to draw</p>"
    width, height = max(n_cols * CELL_W + 2, len(caption) * 7), n_rows * CELL_H + 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + (18 if caption else 0)}" '
             'style="font-family: sans-serif; font-size: 11px;">']
    for r, row in enumerate(cells):
        for c, cell in enumerate(row):
            x, y = 1 + c * CELL_W, 1 + r * CELL_H
            fill = PALETTE[cell.group % len(PALETTE)]
            parts.append(f'<g><title>{esc(cell.title)}</title>'
                         f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
                         f'style="fill: {fill}; fill-opacity: 0.8; stroke: #333; stroke-width: 1;"/>')
            n = len(cell.lines)
            for i, line in enumerate(cell.lines):
                ty = y + CELL_H / 2 + (i - (n - 1) / 2) * 13 + 4
                parts.append(f'<text x="{x + CELL_W / 2:g}" y="{ty:g}" text-anchor="middle">{esc(line)}</text>')
            parts.append("</g>")
    if caption:
        parts.append(f'<text x="{width / 2:g}" y="{height + 13}" text-anchor="middle">{esc(caption)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def as_rows(shape: Sequence[int]) -> tuple[int, int]:
    """A grid of ``shape`` drawn in 2-D: the first dimension down, the rest flattened across
    (one dimension goes across)."""
    if len(shape) < 2:
        return 1, math.prod(shape)
    return shape[0], math.prod(shape[1:])


def _split(index: Sequence[int], shape: Sequence[int]) -> tuple[int, int]:
    """Where grid index ``index`` of ``shape`` lands in :func:`as_rows`' layout."""
    if len(shape) < 2:
        return 0, _ravel(index, shape)
    return index[0], _ravel(index[1:], shape[1:])


def _caption(names: Sequence[str]) -> str:
    if len(names) < 2:
        return f"{names[0]} \u2192" if names else ""
    return f"{names[0]} \u2193   {' x '.join(names[1:])} \u2192"


def _groups(devices: Iterable[Any]) -> dict[tuple[int, int], int]:
    """A colour group per host, in order of first appearance."""
    return {k: i for i, k in enumerate(dict.fromkeys((d.island, d.host) for d in devices))}


def _short(items: Sequence[str], keep: int = 2) -> str:
    return ",".join(items[:keep]) + (f" +{len(items) - keep}" if len(items) > keep else "")


def mesh_svg(mesh: Any) -> str:
    """The mesh's devices in a grid (first axis down, the others across), coloured by host."""
    groups = _groups(mesh.devices)
    n_rows, n_cols = as_rows([n for _, n in mesh.axes])
    cells = []
    for r in range(n_rows):
        row = []
        for c in range(n_cols):
            p = r * n_cols + c
            d = mesh.devices[p]
            where = ", ".join(f"{a}={i}" for a, i in mesh.coords(p).items())
            row.append(Cell((f"device {d.id}", host_label(d)), groups[d.island, d.host],
                            f"{where}: device {d.id}, island {d.island}, host {d.host} ({d.address})"))
        cells.append(row)
    return grid_svg(cells, _caption(mesh.axis_names))


def sharding_svg(sharding: Any) -> str:
    """The array's blocks in a grid, each labelled with the devices (and hosts) holding it."""
    mesh = sharding.mesh
    groups = _groups(mesh.devices)
    parts = [sharding.parts(d) for d in range(len(sharding.shape))]
    n_rows, n_cols = as_rows(parts)
    cells: list[list[Cell | None]] = [[None] * n_cols for _ in range(n_rows)]
    for block, positions in sharding.positions_by_block().items():
        r, c = _split(block, parts)
        devices = [mesh.devices[p] for p in positions]
        hosts = list(dict.fromkeys(host_label(d) for d in devices))
        where = ", ".join(f"{s.start}:{s.stop}" for s in sharding.index(positions[0]))
        cells[r][c] = Cell(
            (_short([f"d{d.id}" for d in devices]), _short(hosts, 1)),
            groups[devices[0].island, devices[0].host],
            f"block [{where}] on device(s) {[d.id for d in devices]}, host(s) "
            f"{sorted({d.address for d in devices})}",
        )
    names = [f"dim {d} ({'/'.join(sharding.spec.axes_of(d)) or '-'})" for d in range(len(parts))]
    return grid_svg([[c for c in row if c is not None] for row in cells], _caption(names))


def _ravel(index: Sequence[int], shape: Sequence[int]) -> int:
    out = 0
    for i, n in zip(index, shape):
        out = out * n + i
    return out
