"""Many machines on one: network namespaces joined by a bridge, each running the dask-CLI recipe.

:class:`NetnsSystem` (``harness.py``) starts the scheduler and every host in a
namespace of its own; ``links.py`` shapes, cuts and heals their links with
``tc``. Tests, and ``pathdask bench dispatch --netns``, use it. Needs Linux,
root and iproute2.
"""

from __future__ import annotations

from .harness import NetnsSystem
from .links import LinkError, Shape, kernel_has_netem, unavailable

__all__ = ["LinkError", "NetnsSystem", "Shape", "kernel_has_netem", "unavailable"]
