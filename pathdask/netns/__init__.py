"""Many machines on one: network namespaces joined by a bridge, each running the dask-CLI recipe.

:class:`NetnsSystem` (``harness.py``) starts the scheduler and every host in a
namespace of its own; ``links.py`` shapes, cuts and heals their links with
``tc``; ``network.py`` builds them, on a veth pair each, or on a user-space
delay line (``delayline.py``, ``delaylink.py``) where a link needs a delay and
the kernel has no ``netem``. Tests, ``pathdask bench dispatch --netns`` and
``pathdask bench delayline`` use it. Needs Linux, root and iproute2 (and
``/dev/net/tun`` for a delay without netem).
"""

from __future__ import annotations

from .harness import NetnsSystem
from .links import LinkError, Shape, kernel_has_netem, unavailable
from .network import Network, delay_unavailable

__all__ = ["LinkError", "NetnsSystem", "Network", "Shape", "delay_unavailable", "kernel_has_netem",
           "unavailable"]
