"""``NetnsSystem``: the dask-CLI recipe on N machines made of network namespaces on this one.

Each machine (the scheduler's, and one per host) is a network namespace with
its own ``eth0``, joined to a bridge (the switch) by a veth pair, or by a
user-space delay line where its link needs a delay and the kernel has no
``netem`` (:mod:`~pathdask.netns.network`), with an address from the
benchmarking range 198.18.0.0/15. This process (the client) sits on the switch
itself. In each namespace the very commands of
``cluster/README.md`` run: ``dask scheduler --preload pathdask.preload`` and
``dask worker --preload pathdask.preload --pathdask-host N``. Every link can be
shaped (:class:`~pathdask.netns.links.Shape`: rate, delay and loss), and cut without a FIN (:meth:`NetnsSystem.partition`),
then healed.

Every name carries a random suffix, so parallel or leftover runs never collide.
:meth:`NetnsSystem.close` (also on a failed start) stops the processes it
started, by handle, then its delay lines, and deletes the namespaces, links and
bridge it made.

Needs Linux, root and iproute2 (:func:`~pathdask.netns.links.unavailable` says
what is missing), and ``/dev/net/tun`` for a delay without ``netem``.

Examples
--------
>>> with NetnsSystem(Topology(islands=2, hosts_per_island=1)) as system:  # doctest: +SKIP
...     client = system.client(name="alice")
...     system.partition(1)       # host 1's link drops every packet
...     system.heal(1)
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Self

import yaml
from distributed import Security

from ..deploy import ProcessGroup, dask_command
from ..protocol import WaitHosts
from ..systems import System
from ..topology import Topology
from .links import LinkError, Shape
from .network import Network

__all__ = ["NetnsSystem"]

logger = logging.getLogger("pathdask.netns")

SCHEDULER_PORT = 8786


class NetnsSystem(System):
    """A scheduler machine and one machine per host, each a network namespace (see the module).

    Parameters
    ----------
    topology : Topology
        Written to a YAML file that the scheduler's preload loads.
    shape : Shape, optional
        Every machine's link (default: unshaped).
    shapes : dict, optional
        Some machines' links instead (``{"host0": Shape(delay=0.05)}``; the names are
        ``"scheduler"``, ``"host0"``, ...). A machine whose shape has a delay or loss is built on
        a user-space delay line where the kernel has no ``netem``; only such a machine can be given
        a delay later with :meth:`set_shape` there.
    delay_line : bool, optional
        As :class:`~pathdask.netns.network.Network`'s: ``True`` builds every link on a delay line.
    tls : bool
        Run Dask's comms (and so pathdask's host transport) over TLS, with temporary
        certificates written for the ``dask`` commands' ``--tls-*`` options.
    env : dict, optional
        Extra environment for the scheduler and workers (e.g. ``DASK_PATHDASK__HOST_TIMEOUT``).
    timeout : float
        Seconds to wait for the scheduler and every host to come up.
    """

    def __init__(self, topology: Topology, *, shape: Shape | None = None, shapes: dict[str, Shape] | None = None,
                 delay_line: bool | None = None, tls: bool = False, env: dict[str, str] | None = None,
                 timeout: float = 90.0) -> None:
        super().__init__(topology)
        self.shape = shape or Shape()
        self.shapes = dict(shapes or {})
        self.delay_line = delay_line
        self.tls = tls
        self.env = dict(env or {})
        self.timeout = timeout
        self.net: Network | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="pathdask-netns-"))
        self.processes = ProcessGroup(self.workdir, timeout, self.env)
        self.address = ""
        self.cut: set[str] = set()

    # -- the network ---------------------------------------------------------------
    def _network(self) -> None:
        names = ["scheduler", *(f"host{h}" for h in range(self.topology.num_hosts))]
        unknown = set(self.shapes) - set(names)
        if unknown:
            raise KeyError(f"shapes for no machine: {sorted(unknown)}; the machines are {names}")
        self.net = Network(delay_line=self.delay_line)
        for name, n in zip(names, [2, *range(10, 10 + self.topology.num_hosts)], strict=True):
            self.net.add(name, n, self.shapes.get(name, self.shape))

    @property
    def network(self) -> Network:
        if self.net is None:
            raise RuntimeError("the system's network is not up: start() it first")
        return self.net

    @property
    def suffix(self) -> str:
        return self.network.suffix

    def ip_of(self, name: str) -> str:
        return self.network.machine(name).ip

    def set_shape(self, name: str, shape: Shape) -> None:
        """Shape machine ``name``'s link (``"scheduler"``, ``"host0"``, ...): its rate both ways, its
        delay and loss on what it sends (a veth needs ``netem`` for those)."""
        self.network.set_shape(name, shape)

    def _machine_of(self, host: int | str) -> str:
        name = host if isinstance(host, str) else f"host{host}"
        return self.network.machine(name).name

    def partition(self, host: int | str) -> None:
        """Machine ``host``'s link drops every packet, both ways, silently (no FIN, no RST)."""
        name = self._machine_of(host)
        self.network.partition(name)
        self.cut.add(name)

    def heal(self, host: int | str) -> None:
        """Machine ``host``'s link carries packets again, shaped as before."""
        name = self._machine_of(host)
        self.network.heal(name)
        self.cut.discard(name)

    def link_bytes(self, host: int | str) -> dict[str, int]:
        """Bytes the kernel counted on machine ``host``'s link: ``recv`` (into it) and ``sent``."""
        return self.network.link_bytes(self._machine_of(host))

    # -- the processes ---------------------------------------------------------------
    def start(self) -> Self:
        try:
            self._network()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _tls_args(self, role: str) -> list[str]:
        if not self.tls:
            return []
        paths = {k: self.workdir / f"{k}.pem" for k in ("ca", f"{role}-cert", f"{role}-key")}
        return ["--tls-ca-file", str(paths["ca"]), "--tls-cert", str(paths[f"{role}-cert"]),
                "--tls-key", str(paths[f"{role}-key"])]

    def _write_certificates(self) -> None:
        sec = Security.temporary()  # needs cryptography
        pems = {"ca": sec.tls_ca_file, "scheduler-cert": sec.tls_scheduler_cert,
                "scheduler-key": sec.tls_scheduler_key, "worker-cert": sec.tls_worker_cert,
                "worker-key": sec.tls_worker_key}
        for name, pem in pems.items():
            (self.workdir / f"{name}.pem").write_text(str(pem))
        self.security = sec

    def _start(self) -> None:
        protocol = "tls" if self.tls else "tcp"
        if self.tls:
            self._write_certificates()
        topo = self.workdir / "topology.yaml"
        topo.write_text(yaml.safe_dump({"topology": self.topology.to_dict()}))
        sched_file = self.workdir / "scheduler.json"
        ip = self.ip_of("scheduler")
        self._spawn("scheduler", dask_command("scheduler") + [
            "--protocol", protocol, "--host", ip, "--port", str(SCHEDULER_PORT),
            "--scheduler-file", str(sched_file), "--no-dashboard", "--dashboard-address", f"{ip}:0",
            *self._tls_args("scheduler"),
            "--preload", "pathdask.preload", "--pathdask-topology", str(topo),
        ])
        self.address = self.processes.wait(lambda: json.loads(sched_file.read_text())["address"], "the scheduler")
        for host in range(self.topology.num_hosts):
            self.start_host(host)
        self._connect_admin(self.address)
        n = self.topology.num_hosts
        self.processes.wait(lambda: self._admin_call(WaitHosts(n, "1s")), f"{n} pathdask hosts")

    def start_host(self, host: int) -> None:
        """Start host ``host``'s ``dask worker`` in its namespace (again, after it stopped)."""
        name = f"host{host}"
        self._spawn(name, dask_command("worker") + [
            self.address, "--host", self.ip_of(name), "--nthreads", str(self.topology.devices_per_host),
            "--nworkers", "1", "--no-dashboard", "--name", name,
            "--local-directory", str(self.workdir / name), "--death-timeout", "60",
            *self._tls_args("worker"),
            "--preload", "pathdask.preload", "--pathdask-host", str(host),
        ])

    def _spawn(self, name: str, argv: list[str]) -> None:
        # `ip netns exec` execs the command: the handle is the dask process itself
        self.processes.spawn(name, ["ip", "netns", "exec", self.network.machine(name).namespace, *argv])

    def pid(self, name: str) -> int:
        """The process id of ``name``'s ``dask`` command (its nanny, for a host)."""
        return self.processes.pid(name)

    @property
    def client_address(self) -> str:
        return self.address

    @property
    def scheduler_address(self) -> str:
        return self.address

    def log(self, name: str, lines: int = 30) -> str:
        return self.processes.log(name, lines)

    def logs(self, lines: int = 20) -> str:
        return self.processes.logs(lines)

    # -- the end -----------------------------------------------------------------------
    def _stop(self) -> None:
        for name in list(self.cut):  # a partitioned worker would wait out its nanny's timeouts
            with contextlib.suppress(LinkError):
                self.heal(name)
        try:
            self.processes.stop()
        finally:
            self._teardown_network()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _teardown_network(self) -> None:
        """Stop the delay lines, delete the namespaces, links and bridge (see :meth:`Network.close`)."""
        if self.net is not None:
            self.net.close()
