"""``System``: what every pathdask system offers, however its processes are started.

A system starts a Dask scheduler with pathdask's plugin and one worker per
host, keeps an admin Dask client to it, and hands out pathdask clients (one per
tenant). Those, observation of the devices (:class:`~pathdask.client.observe.Observed`,
through the admin client) and an orderly close are the same for an embedded
cluster (:class:`~pathdask.LocalSystem`) and a dask-CLI one
(:class:`~pathdask.deploy.CliSystem`); each subclass says only how it starts and
stops its processes.
"""

from __future__ import annotations

from typing import Any, Self

from distributed import Client as DaskClient
from distributed import Security

from .client.client import Client
from .client.observe import Observed, Observer
from .interrupts import unwinding
from .protocol import Message
from .topology import Topology

__all__ = ["System"]


class System(Observed):
    """The clients, the admin client and the observation of a pathdask system (a base class).

    Subclasses start their processes in :meth:`start` (then :meth:`_connect_admin`),
    stop them in :meth:`_stop`, and say where clients connect (:attr:`client_address`).
    """

    def __init__(self, topology: Topology, security: Security | None = None) -> None:
        self.topology = topology
        self.security = security
        self._admin: DaskClient | None = None
        self._observer_of_admin: Observer | None = None
        self._clients: list[Client] = []

    # -- what a subclass says --------------------------------------------------------
    def start(self) -> Self:
        raise NotImplementedError

    @property
    def client_address(self) -> str:
        """The scheduler address a client in this process connects to."""
        raise NotImplementedError

    def _client_loop(self) -> Any:
        """The event loop clients run on (``None``: a loop of their own)."""
        return None

    def _stop(self) -> None:
        """Stop the scheduler and the hosts (after the clients and the admin client closed)."""

    def _before_admin_closes(self, admin: DaskClient) -> None:
        """What to do with the admin client before the system closes (nothing by default)."""

    # -- shared ----------------------------------------------------------------------
    def _connect_admin(self, address: Any) -> DaskClient:
        """Connect the admin client (to an address, or a Dask cluster object)."""
        self._admin = DaskClient(address, set_as_default=False, security=self.security)
        self._observer_of_admin = Observer(self._admin)
        return self._admin

    @property
    def _observer(self) -> Observer:
        if self._observer_of_admin is None:
            raise RuntimeError(f"This {type(self).__name__} is not started; use `with {type(self).__name__}(...)` "
                               "or .start()")
        return self._observer_of_admin

    def _admin_call(self, msg: Message) -> Any:
        return self._observer.ask(msg)

    def client(self, name: str = "client", weight: float = 1.0) -> Client:
        """A new pathdask client (one tenant) connected to this system."""
        address = self.client_address
        c = Client(address, name=name, weight=weight, security=self.security, loop=self._client_loop())
        self._clients.append(c)
        return c

    def close(self) -> None:
        """Close the clients, then the admin client, then the scheduler and hosts."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        admin, self._admin, self._observer_of_admin = self._admin, None, None
        if admin is not None:
            self._before_admin_closes(admin)
            admin.close()
        self._stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            unwinding()  # a second Ctrl-C must not cut the shutdown short
        self.close()
