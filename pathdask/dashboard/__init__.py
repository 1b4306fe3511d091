"""The pathdask dashboard: what devices run, hold and move, on Dask's dashboard server.

- :mod:`.record` and :mod:`.collect`: the scheduler's bounded record of device
  activity, pulled from the hosts while someone watches;
- :mod:`.views`: what each page shows, as JSON-able data;
- :mod:`.api`: the JSON routes ``/pathdask/api/<view>``;
- :mod:`.pages` and :mod:`.gantt`: the Bokeh pages ``/pathdask/<view>``;
- :mod:`.install`: adds both to a running scheduler's HTTP server;
- :mod:`.trace`: ``Client.trace()`` as an ``xarray.Dataset``, and its
  ``.pathdask.plot()`` accessor.
"""

from __future__ import annotations

from .collect import Collector
from .install import install

__all__ = ["Collector", "install"]
