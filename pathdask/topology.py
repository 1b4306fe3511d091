"""Topologies: islands x hosts x devices, device speed and link models.

Sizes and times are parsed with :func:`dask.utils.parse_bytes` and
:func:`dask.utils.parse_timedelta`, so ``"16 GiB"``, ``"100 GB/s"`` and
``"5us"`` all work, in Python and in YAML.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NewType

import yaml
from dask.utils import format_bytes, parse_bytes, parse_timedelta

from .errors import TopologyError

#: topologies shipped with pathdask, loadable by name: ``Topology.load("local")``
PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "topologies")


def packaged_topologies() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(PACKAGED) if f.endswith(".yaml"))


def _topology_file(path: str | os.PathLike[str]) -> str:
    """The file a ``Topology.load`` argument names: a path, or a packaged topology's name."""
    path = os.fspath(path)
    if os.path.exists(path):
        return path
    packaged = os.path.join(PACKAGED, f"{path.removesuffix('.yaml')}.yaml")
    if os.sep not in path and os.path.exists(packaged):
        return packaged
    raise TopologyError(
        f"No topology file {path!r} (from the current directory {os.getcwd()}), and pathdask "
        f"ships no topology of that name; give a path, or one of {packaged_topologies()}"
    )

__all__ = ["DeviceId", "Link", "LinkClass", "Topology", "DeviceInfo"]

DeviceId = NewType("DeviceId", int)
LinkClass = Literal["local", "same_host", "ici", "dcn"]
LINK_CLASSES: tuple[str, ...] = ("same_host", "ici", "dcn")


def _parse(value: Any, field_name: str, parse: Callable[[Any], float | None], expected: str,
           positive: bool = True) -> float:
    """Parse one field; errors name the field, what was expected and what came."""
    try:
        out = parse(value)
    except (ValueError, TypeError, KeyError) as e:
        raise TopologyError(f"Topology field {field_name!r}: expected {expected}, got {value!r}") from e
    if out is None or out < 0 or (positive and out == 0):
        raise TopologyError(
            f"Topology field {field_name!r}: must be {'positive' if positive else '>= 0'}, got {value!r}"
        )
    return out


def _size(value: Any) -> int:
    return parse_bytes(value) if isinstance(value, str) else int(value)


def _rate(value: Any) -> float:
    """``'100 GB/s'`` or ``'100 TFLOP/s'`` (SI prefixes, as parse_bytes reads them) or a number."""
    if not isinstance(value, str):
        return float(value)
    text = value.strip().lower().replace(" ", "")
    for suffix in ("flop/s", "flops", "flop", "/s"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    if text and text[-1] not in "0123456789.b":
        text += "b"  # "100T" -> "100tb" for parse_bytes' SI prefixes
    return float(parse_bytes(text))


def _parse_size(value: Any, field_name: str) -> int:
    return int(_parse(value, field_name, _size, "a size such as '16 GiB' or a number of bytes"))


def _parse_rate(value: Any, field_name: str, example: str) -> float:
    return _parse(value, field_name, _rate, f"a rate such as {example!r}")


def _parse_time(value: Any, field_name: str) -> float:
    return _parse(value, field_name, lambda v: parse_timedelta(v, default="s"),
                  "a duration such as '5us'", positive=False)


def _parse_count(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(
            f"Topology field {field_name!r}: expected a positive integer, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Link:
    """A link model: each transfer costs ``latency + nbytes / bandwidth``.

    Parameters
    ----------
    bandwidth : str or float
        Bytes per second, e.g. ``"100 GB/s"``.
    latency : str or float
        Seconds, e.g. ``"5us"``.
    """

    bandwidth: float
    latency: float

    @classmethod
    def parse(cls, value: Any, field_name: str) -> Link:
        if isinstance(value, Link):
            return value
        if not isinstance(value, dict) or set(value) != {"bandwidth", "latency"}:
            raise TopologyError(
                f"Topology field {field_name!r}: expected a mapping with 'bandwidth' and "
                f"'latency', e.g. {{'bandwidth': '100 GB/s', 'latency': '5us'}}, got {value!r}"
            )
        return cls(
            bandwidth=_parse_rate(value["bandwidth"], f"{field_name}.bandwidth", "25 GB/s"),
            latency=_parse_time(value["latency"], f"{field_name}.latency"),
        )

    def seconds(self, nbytes: int) -> float:
        """Modelled time of one transfer of ``nbytes`` over this link."""
        return self.latency + nbytes / self.bandwidth

    def describe(self) -> str:
        return f"{format_bytes(int(self.bandwidth))}/s, {self.latency * 1e6:g} us"


@dataclass(frozen=True)
class DeviceInfo:
    """Where one physical device lives. ``address`` is its host's worker address."""

    id: DeviceId
    island: int
    host: int
    index: int
    address: str = ""

    def __repr__(self) -> str:
        return f"Device({self.id}: island {self.island}, host {self.host}, #{self.index})"


@dataclass(frozen=True)
class Topology:
    """Islands x hosts x devices, with HBM, device speed and three link models.

    Parameters
    ----------
    islands, hosts_per_island, devices_per_host : int
        The shape of the cluster. One Dask worker runs each host.
    hbm : str or int
        HBM bytes per device, e.g. ``"16 GiB"``.
    device_flops : str or float
        Modelled device speed, e.g. ``"100 TFLOP/s"``; used by FLOPs ``cost=`` callables.
    same_host, ici, dcn : dict or Link
        Link models between devices of one host, of one island, and of two islands.

    Examples
    --------
    >>> topo = Topology(islands=1, hosts_per_island=2, devices_per_host=2, hbm="1 GiB")
    >>> topo.num_devices
    4
    """

    islands: int = 2
    hosts_per_island: int = 2
    devices_per_host: int = 2
    hbm: int = field(default=16 * 2**30)
    device_flops: float = 100e12
    same_host: Link = field(default=Link(bandwidth=400e9, latency=1e-6))
    ici: Link = field(default=Link(bandwidth=100e9, latency=5e-6))
    dcn: Link = field(default=Link(bandwidth=25e9, latency=50e-6))

    def __post_init__(self) -> None:
        for name in ("islands", "hosts_per_island", "devices_per_host"):
            object.__setattr__(self, name, _parse_count(getattr(self, name), name))
        object.__setattr__(self, "hbm", _parse_size(self.hbm, "hbm"))
        object.__setattr__(
            self, "device_flops", _parse_rate(self.device_flops, "device_flops", "100 TFLOP/s")
        )
        for name in LINK_CLASSES:
            object.__setattr__(self, name, Link.parse(getattr(self, name), name))

    # -- construction -------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        """Build from a mapping such as a parsed YAML file; unknown keys are errors."""
        if not isinstance(data, dict):
            raise TopologyError(f"A topology must be a mapping, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise TopologyError(
                f"Unknown topology field(s) {unknown}; the known fields are {sorted(known)}"
            )
        return cls(**data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        """Load a topology from a YAML file, or one shipped with pathdask by name.

        Examples
        --------
        >>> Topology.load("local")                      # 2 islands x 2 hosts x 2 devices  # doctest: +SKIP
        >>> Topology.load("cluster/local.yaml")         # a file  # doctest: +SKIP
        """
        file = _topology_file(path)
        try:
            with open(file) as f:
                data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise TopologyError(f"Topology file {file} is not valid YAML: {e}") from None
        if data is None:
            raise TopologyError(
                f"Topology file {file} is empty; it needs a `topology:` mapping such as "
                f"{{islands: 2, hosts_per_island: 2, devices_per_host: 2}}"
            )
        if isinstance(data, dict) and "topology" in data:
            data = data["topology"]
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that :meth:`from_dict` turns back into an equal topology."""
        return asdict(self)

    # -- derived ------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        return self.islands * self.hosts_per_island

    @property
    def num_devices(self) -> int:
        return self.num_hosts * self.devices_per_host

    @property
    def devices_per_island(self) -> int:
        return self.hosts_per_island * self.devices_per_host

    def host_slot(self, host_index: int) -> tuple[int, int]:
        """(island, host-in-island) of the ``host_index``-th host."""
        return divmod(host_index, self.hosts_per_island)

    def devices_of_host(self, island: int, host: int) -> list[DeviceInfo]:
        base = (island * self.hosts_per_island + host) * self.devices_per_host
        return [
            DeviceInfo(DeviceId(base + i), island, host, i) for i in range(self.devices_per_host)
        ]

    def link_class(self, a: DeviceInfo, b: DeviceInfo) -> str:
        if a.id == b.id:
            return "local"
        if a.island != b.island:
            return "dcn"
        if a.host != b.host:
            return "ici"
        return "same_host"

    def link(self, cls_name: str) -> Link | None:
        return None if cls_name == "local" else getattr(self, cls_name)

    def describe(self) -> str:
        return (
            f"{self.islands} island(s) x {self.hosts_per_island} host(s) x "
            f"{self.devices_per_host} device(s), {format_bytes(self.hbm)} HBM, "
            f"{self.device_flops / 1e12:g} TFLOP/s; same host {self.same_host.describe()}, "
            f"ICI {self.ici.describe()}, DCN {self.dcn.describe()}"
        )


def device_info(topology: Topology, device: int, address: str = "") -> DeviceInfo:
    """The :class:`DeviceInfo` of global device id ``device`` in ``topology``."""
    host_global, index = divmod(int(device), topology.devices_per_host)
    island, host = divmod(host_global, topology.hosts_per_island)
    return DeviceInfo(DeviceId(int(device)), island, host, index, address)
