"""The pure cores: the logic of a host and of the island scheduler as state machines.

No threads, sockets, Dask objects or clocks: events go in (protocol records and a
few events of their own), instructions come out, and the adapters
(``worker/runtime.py``, ``scheduler/plugin.py``) carry them out. The property
tests (``tests/test_invariant.py``) drive these very classes.
"""
