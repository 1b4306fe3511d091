"""``LocalSystem``: an embedded pathdask cluster on a Dask ``LocalCluster``."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any, Self

import dask
from dask.utils import parse_timedelta
from distributed import Client as DaskClient
from distributed import LocalCluster, Scheduler, Security

from .protocol import Info, WaitHosts
from .scheduler.plugin import PathwaysScheduler
from .systems import System
from .topology import Topology

__all__ = ["LocalSystem", "default_topology", "local_dask_intervals"]

DEFAULT_TOPOLOGY = "local"


def default_topology() -> Topology:
    """The packaged ``local`` topology (2 islands x 2 hosts x 2 devices)."""
    return Topology.load(DEFAULT_TOPOLOGY)


@contextlib.contextmanager
def _workers_ignore_interrupts(processes: bool) -> Iterator[None]:
    """Worker processes started in here ignore SIGINT, as they inherit an ignored signal.

    Ctrl-C in a terminal reaches every process of the foreground group; this
    process then shuts the cluster down in order, instead of each worker dying
    with its own traceback. A Ctrl-C while the workers start is ignored too.
    """
    if not processes or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


#: ``pathdask.local-dask-intervals`` -> the Dask setting each one sets
DASK_INTERVALS = {
    "tick": "distributed.admin.tick.interval",
    "system-monitor": "distributed.admin.system-monitor.interval",
    "memory-monitor": "distributed.worker.memory.monitor-interval",
}


def local_dask_intervals() -> dict[str, str]:
    """The Dask settings of a ``LocalSystem``'s periodic monitors (``pathdask.local-dask-intervals``):
    an interval left ``null`` keeps Dask's. A bad value fails here, naming the setting."""
    chosen = dask.config.get("pathdask.local-dask-intervals") or {}
    unknown = set(chosen) - set(DASK_INTERVALS)
    if unknown:
        raise ValueError(f"pathdask.local-dask-intervals has no {sorted(unknown)}; it sets {sorted(DASK_INTERVALS)}")
    out = {}
    for name, value in chosen.items():
        if value is None:
            continue
        try:
            parse_timedelta(value)
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"pathdask.local-dask-intervals.{name} must be a duration such as '200ms', "
                             f"got {value!r}") from None
        out[DASK_INTERVALS[name]] = value
    return out


def _stop_heartbeat(dask_worker: Any) -> None:
    dask_worker.periodic_callbacks["heartbeat"].stop()


class LocalSystem(System):
    """A ``LocalCluster`` with one worker per host and pathdask's plugins installed.

    Parameters
    ----------
    topology : Topology, optional
        Defaults to ``Topology.load("local")`` (2 islands x 2 hosts x 2 devices).
    processes : bool
        One process per host (the default) or all hosts in this process. In this
        process, the hosts have no Dask memory limit (``memory_limit=0`` unless given):
        Dask would weigh the whole process against each one's share.
    dashboard_address : str or None
        Where the Dask dashboard listens; ``None`` disables it.
    policy : str, optional
        How the island scheduler shares devices between clients: ``"fifo"`` or
        ``"proportional"`` (by client weight). Defaults to ``pathdask.policy``.
    threads_per_worker : int, optional
        Dask threads per host; defaults to ``devices_per_host``, which sequential
        dispatch needs (one waiting task per device).
    security : distributed.Security or bool, optional
        Dask's security settings; ``True`` makes temporary certificates
        (``Security.temporary()``). With TLS, Dask's comms and pathdask's
        host-to-host transport both use it.
    ordering, dispatch_jitter
        Test-only switches, see :class:`~pathdask.scheduler.plugin.PathwaysScheduler`.

    Examples
    --------
    >>> with LocalSystem(Topology(islands=1, hosts_per_island=2)) as system:
    ...     client = system.client(name="alice")
    """

    def __init__(self, topology: Topology | None = None, *, processes: bool = True,
                 dashboard_address: str | None = "127.0.0.1:0", threads_per_worker: int | None = None,
                 policy: str | None = None, ordering: bool = True, dispatch_jitter: float = 0.0,
                 silence_logs: int = logging.ERROR, security: Security | bool | None = None,
                 **cluster_kwargs: Any) -> None:
        super().__init__(topology or default_topology(),
                         Security.temporary() if security is True else security or None)
        self._plugin = PathwaysScheduler(self.topology, ordering=ordering, dispatch_jitter=dispatch_jitter,
                                         policy=policy)
        self._dashboard = dashboard_address is not None
        if dashboard_address is None:
            # LocalCluster reads None as the default :8787, and the scheduler's HTTP
            # server listens even without a dashboard: keep it on a free loopback port.
            cluster_kwargs.setdefault("scheduler_kwargs", {})["dashboard"] = False
            dashboard_address = "127.0.0.1:0"
        # A worker's Dask data holds the handles of program outputs; their buffers live in the
        # device stores, under modelled HBM. A plain dict keeps Dask from weighing and spilling
        # those handles on every call.
        cluster_kwargs.setdefault("data", dict)
        if not processes:
            # Every host in one process: Dask would weigh this whole process's memory against
            # each worker's share of the machine (its memory limit), and past 80% pause every
            # worker and have each collect garbage on every memory-monitor tick, each up to 5%
            # of the event loop they share. At 32 hosts that held the loop for tens of seconds,
            # long enough for the hosts to be taken for lost. Device memory is modelled HBM
            # (``pathdask.worker.store``), whatever Dask's limit.
            cluster_kwargs.setdefault("memory_limit", 0)
        protocol = "tls" if self.security is not None and self.security.require_encryption else "tcp"
        scheduler_kwargs = cluster_kwargs.setdefault("scheduler_kwargs", {})
        #: clients made by :meth:`client` live in this process, as the scheduler does: they reach it
        #: through Dask's in-process comm (no socket, no serialization); hosts and other processes
        #: use the scheduler's network address. Not with TLS, whose settings cover every comm.
        self._inproc = protocol == "tcp" and not {"protocol", "host", "port"} & set(scheduler_kwargs)
        if self._inproc:
            scheduler_kwargs.update(protocol=[protocol, "inproc"], host=["127.0.0.1", None],
                                    port=[cluster_kwargs.pop("scheduler_port", 0), None])
        self._cluster_kwargs = dict(
            n_workers=self.topology.num_hosts,
            # one Dask thread per device: sequential dispatch runs one task per device at once
            threads_per_worker=threads_per_worker or self.topology.devices_per_host,
            processes=processes, host="127.0.0.1", dashboard_address=dashboard_address,
            protocol=protocol, security=self.security,
            worker_dashboard_address=None, silence_logs=silence_logs, **cluster_kwargs,
        )
        self.cluster: LocalCluster | None = None

    def start(self) -> Self:
        if self.cluster is not None:
            return self
        # Dask's statistical profiler samples every thread of every worker each 10 ms; with
        # the hosts sharing this machine's cores, that takes CPU from the devices and calls
        # of all of them (pathdask.local-dask-profiler).
        local = {"distributed.worker.profile.enabled": bool(dask.config.get("pathdask.local-dask-profiler")),
                 **local_dask_intervals()}
        with _workers_ignore_interrupts(self._cluster_kwargs["processes"]), dask.config.set(local):
            self.cluster = self._make_cluster()
        try:
            admin = self._connect_admin(self.cluster)
            admin.register_plugin(self._plugin, name="pathdask")
            self._admin_call(WaitHosts())
        except BaseException:
            self.close()
            raise
        return self

    def _make_cluster(self) -> LocalCluster:
        """The Dask cluster: its scheduler and a worker per host (under the local intervals)."""
        return LocalCluster(**self._cluster_kwargs)

    @property
    def scheduler_address(self) -> str:
        return self._require().scheduler_address

    @property
    def dashboard_link(self) -> str | None:
        return self._require().dashboard_link if self._dashboard else None

    def __repr__(self) -> str:
        t = self.topology
        where = f"scheduler={self.cluster.scheduler_address}" if self.cluster is not None else "not started"
        return (f"<pathdask.LocalSystem {t.islands}x{t.hosts_per_island}x{t.devices_per_host} devices, "
                f"{where}, {sum(not c._closed for c in self._clients)} open client(s)>")

    def _repr_html_(self) -> str:
        from .html import card, columns, details, link, table

        rows: list[tuple[str, Any]] = [("topology", self.topology.describe())]
        if self.cluster is None:
            return card("pathdask.LocalSystem", "not started", table([*rows, ("status", "not started")]))
        info = self._admin_call(Info())
        rows += [
            ("scheduler", self.cluster.scheduler_address),
            ("dashboard", link(self.dashboard_link) if self.dashboard_link else "off"),
            ("processes", self._cluster_kwargs["processes"]),
        ]
        hosts: dict[str, list[dict[str, Any]]] = {}
        for d in info["devices"]:
            hosts.setdefault(d["address"], []).append(d)
        host_rows = [(devs[0]["island"], devs[0]["host"], addr, " ".join(str(d["id"]) for d in devs),
                      sum(bool(d["slices"]) for d in devs)) for addr, devs in hosts.items()]
        client_rows = [(c.get("name", ""), f"{c.get('weight', 1.0):g}", cid) for cid, c in info["clients"].items()]
        return card("pathdask.LocalSystem", self.topology.describe().split(";")[0], table(rows)
                    + details(f"Hosts ({len(host_rows)})", columns(
                        ("island", "host", "address", "devices", "devices in slices"), host_rows))
                    + details(f"Clients ({len(client_rows)})", columns(("name", "weight", "id"), client_rows),
                              open_=True))

    def _require(self) -> LocalCluster:
        if self.cluster is None:
            raise RuntimeError("This LocalSystem is not started; use `with LocalSystem(...)` or .start()")
        return self.cluster

    @property
    def client_address(self) -> str:
        """The scheduler address for a client in this process: its in-process comm where it has one."""
        cluster = self._require()
        if self._inproc:
            assert isinstance(cluster.scheduler, Scheduler)
            return next(ln.contact_address for ln in cluster.scheduler.listeners
                        if ln.contact_address.startswith("inproc://"))
        return cluster.scheduler_address

    def _client_loop(self) -> Any:
        # on the scheduler's own event loop, as Dask's ``Client(cluster)``: a call and its
        # reports pass between client and scheduler with no thread hand-off
        return self._require().loop

    def _stop(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def _before_admin_closes(self, admin: DaskClient) -> None:
        """Stop the workers' heartbeats before the cluster closes.

        A worker that closes while its heartbeat is in flight aborts the heartbeat's
        connection and logs a traceback for it, although nothing went wrong; with no
        heartbeat left to send, the shutdown is silent.
        """
        with contextlib.suppress(Exception):
            admin.run(_stop_heartbeat, on_error="ignore")
