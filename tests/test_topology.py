from __future__ import annotations

import pytest

import pathdask as pw
from pathdask.system import DEFAULT_TOPOLOGY


def test_keywords_and_defaults():
    t = pw.Topology(islands=1, hosts_per_island=3, devices_per_host=4, hbm="2 GiB",
                    device_flops="50 TFLOP/s", ici={"bandwidth": "10 GB/s", "latency": "5us"})
    assert (t.num_hosts, t.num_devices, t.devices_per_island) == (3, 12, 12)
    assert t.hbm == 2 * 2**30
    assert t.device_flops == 50e12
    assert t.ici.bandwidth == 10e9 and t.ici.latency == pytest.approx(5e-6)
    assert t.dcn == pw.Topology().dcn  # defaults kept


def test_default_yaml_is_2x2x2(tmp_path):
    t = pw.Topology.load(DEFAULT_TOPOLOGY)
    assert (t.islands, t.hosts_per_island, t.devices_per_host) == (2, 2, 2)
    assert pw.Topology.from_dict(t.to_dict()) == t
    p = tmp_path / "t.yaml"
    p.write_text("islands: 1\nhosts_per_island: 1\ndevices_per_host: 2\nhbm: 1 MiB\n")
    assert pw.Topology.load(p).hbm == 2**20


def test_link_classes():
    t = pw.Topology()
    devs = [d for i in range(2) for h in range(2) for d in t.devices_of_host(i, h)]
    assert t.link_class(devs[0], devs[0]) == "local"
    assert t.link_class(devs[0], devs[1]) == "same_host"
    assert t.link_class(devs[0], devs[2]) == "ici"
    assert t.link_class(devs[0], devs[4]) == "dcn"
    assert t.ici.seconds(100e9) == pytest.approx(1 + 5e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"hbm": "lots"}, "hbm"),
        ({"hbm": -5}, "hbm"),
        ({"islands": 0}, "islands"),
        ({"devices_per_host": 1.5}, "devices_per_host"),
        ({"device_flops": "fast"}, "device_flops"),
        ({"ici": {"bandwidth": "10 GB/s"}}, "ici"),
        ({"dcn": {"bandwidth": "x", "latency": "1us"}}, "dcn.bandwidth"),
        ({"same_host": {"bandwidth": "1 GB/s", "latency": "soon"}}, "same_host.latency"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(pw.TopologyError, match=f"'{field}'"):
        pw.Topology(**kwargs)


def test_unknown_yaml_field_lists_known(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("topology:\n  islandz: 2\n")
    with pytest.raises(pw.TopologyError, match=r"islandz.*known fields"):
        pw.Topology.load(p)


def test_packaged_topologies_load_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pw.Topology.load("local") == pw.Topology.load("local.yaml")
    assert pw.Topology.load("local").num_devices == 8
    with pytest.raises(pw.TopologyError, match=r"No topology file 'nowhere.yaml'.*one of \['local'\]"):
        pw.Topology.load("nowhere.yaml")


def test_bad_topology_files_are_typed_errors(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    with pytest.raises(pw.TopologyError, match="is empty; it needs a `topology:` mapping"):
        pw.Topology.load(empty)
    broken = tmp_path / "broken.yaml"
    broken.write_text("topology:\n  islands: [1\n")
    with pytest.raises(pw.TopologyError, match=r"(?s)is not valid YAML.*line"):
        pw.Topology.load(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(pw.TopologyError, match="must be a mapping, got list"):
        pw.Topology.load(listed)
