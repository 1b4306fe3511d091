"""Random programs for the stress clients, and what each means in NumPy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import P, PartitionSpec, all_gather, all_to_all, axis_index, function, ppermute, program, psum

Step = tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray], str]

STEP_KINDS = ("scale", "tanh", "offset", "psum", "gather", "permute", "all_to_all", "move", "respec")


def _specs(mesh: Any) -> list[PartitionSpec]:
    """Specs valid for a (rows, cols) array with rows % 16 == 0 and cols % 4 == 0 on ``mesh``."""
    specs = [P("a"), P(), P(None, "a")]
    if "b" in mesh.shape:
        specs += [P("b"), P(None, "b"), P("a", "b"), P(("a", "b"))]
    return specs


def _elementwise(rng: random.Random, mesh: Any, kind: str) -> Step:
    spec = rng.choice(_specs(mesh))
    if kind == "tanh":
        f = function(np.tanh, in_specs=spec, out_specs=spec, name="tanh")
        return (lambda x: f(x, mesh=mesh)), np.tanh, f"tanh{spec}"
    a, c = rng.uniform(-2, 2), rng.uniform(-1, 1)
    g = function(lambda b: b * a + c, in_specs=spec, out_specs=spec, name="scale")
    return (lambda x: g(x, mesh=mesh)), (lambda v: v * a + c), f"scale{spec}"


def _offset(rng: random.Random, mesh: Any, rows: int) -> Step:
    n, s = mesh.shape["a"], rng.uniform(-1, 1)
    f = function(lambda b: b + s * axis_index("a"), in_specs=P("a"), out_specs=P("a"), name="offset")
    ramp = np.repeat(np.arange(n), rows // n)[:, None]
    return (lambda x: f(x, mesh=mesh)), (lambda v: v + s * ramp), "offset"


def _psum(rng: random.Random, mesh: Any) -> Step:
    axis = rng.choice(mesh.axis_names)
    n = mesh.shape[axis]
    if axis == "b":  # blocks are replicated over b: the sum is n times each
        f = function(lambda b: psum(b, "b"), in_specs=P("a"), out_specs=P("a"), name="psum_b")
        return (lambda x: f(x, mesh=mesh)), (lambda v: v * n), "psum_b"
    # every device ends with the sum of the n row blocks: the global array is that sum tiled n times
    g = function(lambda b: psum(b, "a"), in_specs=P("a"), out_specs=P("a"), name="psum_a")
    return (lambda x: g(x, mesh=mesh)), (lambda v: np.tile(v.reshape(n, -1, v.shape[1]).sum(0), (n, 1))), "psum_a"


def _collective(rng: random.Random, mesh: Any, kind: str) -> Step:
    n = mesh.shape["a"]
    if kind == "gather":
        f = function(lambda b: all_gather(b, "a", tiled=True), in_specs=P("a"), out_specs=P(), name="gather")
        return (lambda x: f(x, mesh=mesh)), (lambda v: v), "gather"
    if kind == "permute":
        s = rng.randrange(n) + 1
        perm = [(i, (i + s) % n) for i in range(n)]
        g = function(lambda b: ppermute(b, "a", perm), in_specs=P("a"), out_specs=P("a"), name="permute")
        return ((lambda x: g(x, mesh=mesh)),
                (lambda v: np.roll(v.reshape(n, -1, v.shape[1]), s, 0).reshape(v.shape)), f"permute{s}")
    # tiled all_to_all of row blocks: device j gets chunk j of every block, in member order
    h = function(lambda b: all_to_all(b, "a", 0, 0, tiled=True), in_specs=P("a"), out_specs=P("a"),
                 name="all_to_all")
    return ((lambda x: h(x, mesh=mesh)),
            (lambda v: v.reshape(n, n, -1, v.shape[1]).transpose(1, 0, 2, 3).reshape(v.shape)), "all_to_all")


def _move(rng: random.Random, mesh: Any, other: Any, kind: str) -> Step:
    target = other if kind == "move" else rng.choice([mesh, other])
    spec = P("a") if kind == "move" else rng.choice(_specs(target))
    f = function(lambda b: b - 0.5, in_specs=spec, out_specs=spec, name=kind)
    return (lambda x: f(x, mesh=target)), (lambda v: v - 0.5), f"{kind}{spec}"


def _step(rng: random.Random, mesh: Any, other: Any, rows: int) -> Step:
    """One random step: (a function of one sharded array, its NumPy meaning, a name)."""
    kind = rng.choice(STEP_KINDS)
    if kind in ("scale", "tanh"):
        return _elementwise(rng, mesh, kind)
    if kind == "offset":
        return _offset(rng, mesh, rows)
    if kind == "psum":
        return _psum(rng, mesh)
    if kind in ("gather", "permute", "all_to_all"):
        return _collective(rng, mesh, kind)
    return _move(rng, mesh, other, kind)


@dataclass
class Chain:
    """A random ``@program`` of a few steps, its NumPy reference and where its input starts."""

    prog: Any
    refs: list[Callable[[np.ndarray], np.ndarray]]
    names: list[str]
    shape: tuple[int, int]
    mesh: Any
    spec: PartitionSpec

    def reference(self, value: np.ndarray) -> np.ndarray:
        for ref in self.refs:
            value = ref(value)
        return value


def random_chain(rng: random.Random, meshes: list[Any], max_steps: int) -> Chain:
    """A chain of 1 to ``max_steps`` random steps over the client's two meshes."""
    rows, cols = 16 * rng.randint(1, 2), rng.choice([4, 8])  # any spec of any mesh divides these
    steps = []
    for _ in range(rng.randint(1, max_steps)):
        mesh, other = rng.sample(meshes, 2)
        steps.append(_step(rng, mesh, other, rows))

    def chain(x: Any) -> Any:
        for f, _, _ in steps:
            x = f(x)
        return x

    start = rng.choice(meshes)
    return Chain(program(chain), [r for _, r, _ in steps], [n for _, _, n in steps], (rows, cols), start,
                 rng.choice(_specs(start)))
