"""Preload module for the dask CLI: turns a plain Dask cluster into a pathdask system.

.. code-block:: bash

    dask scheduler --preload pathdask.preload --pathdask-topology cluster/local.yaml
    dask worker tcp://HOST:8786 --nthreads 1 --preload pathdask.preload --pathdask-host 0

On the scheduler it installs the :class:`PathwaysScheduler` plugin (which
then installs the host runtime on every worker). On a worker,
``--pathdask-host N`` asks to be the topology's N-th host; without it the
scheduler assigns the first free one.
"""

from __future__ import annotations

from typing import Any

import click
import dask.config

from . import config  # noqa: F401  (loads the pathdask.* defaults)


@click.command()
@click.option("--pathdask-topology", default=None,
              help="Topology YAML file, or a packaged topology's name such as local (scheduler only)")
@click.option("--pathdask-host", default=None, type=int, help="Which host of the topology this worker is")
def dask_setup(service: Any, pathdask_topology: str | None, pathdask_host: int | None) -> None:
    from distributed import Scheduler

    if isinstance(service, Scheduler):
        from .scheduler.plugin import PathwaysScheduler
        from .system import default_topology
        from .topology import Topology

        path = pathdask_topology or dask.config.get("pathdask.scheduler.topology", None)
        topology = Topology.load(path) if path else default_topology()
        service.add_plugin(PathwaysScheduler(topology), name="pathdask")
    else:
        from .compat import restart_when_forgotten

        # a host declared lost while its link was down rejoins once it heals (liveness.py)
        restart_when_forgotten(service)
        if pathdask_host is not None:
            dask.config.set({"pathdask.worker.host": pathdask_host})
