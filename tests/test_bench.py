"""The benchmarks run in a small configuration; their JSON holds every system's figures."""

from __future__ import annotations

import json
import os

import pytest

from pathdask.bench import dispatch


@pytest.mark.slow
def test_bench_dispatch_small(tmp_path):
    result = dispatch.run(dispatch.Config.small(), out=str(tmp_path), echo=lambda s: None, processes=False)
    data = json.loads((tmp_path / "dispatch.json").read_text())
    assert (tmp_path / "dispatch.html").stat().st_size > 10_000
    fig5 = data["figure5"]
    for system in ("dask", "pathdask-seq", "pathdask", "multi-controller"):
        for shape in ("OpByOp", "Chained", "Fused"):
            rate = fig5[system][shape]
            assert rate is None if (system, shape) == ("dask", "Fused") else rate > 0, (system, shape)
    paired = data["figure5_over_multicontroller"]["paired_median"]  # the rounds' ratios, median
    assert set(paired) == {"pathdask", "pathdask-unbatched"}
    assert all(paired[system][shape] > 0 for system in paired for shape in ("OpByOp", "Chained", "Fused"))
    assert data["ratios"]["pathdask_fused_over_multicontroller"] == paired["pathdask"]["Fused"]
    fig6 = data["figure6"]["rates"]
    assert set(fig6) == {f"{s} {shape}" for s in ("dask", "pathdask", "multi-controller")
                         for shape in ("OpByOp", "Chained")}
    assert all(len(v) == len(dispatch.Config.small().costs) for v in fig6.values())
    assert set(data["figure7"]["parallel"]) == set(data["figure7"]["sequential"]) == {"1", "2"}
    for key in ("pathdask_chained_over_dask_opbyop", "pathdask_chained_over_multicontroller_fused",
                "pathdask_chained_1ms_fraction_of_ideal", "pipeline_parallel_over_sequential"):
        assert data["ratios"][key] is not None
    assert result["idle_gap_median_s"] is not None and result["idle_gap_median_s"] >= 0
    tls = data["security"]["rates"]  # the same workload on a system with TLS everywhere
    assert tls["OpByOp"] > 0 and tls["Chained"] > 0 and data["ratios"]["tls_over_plain_chained"] > 0
    assert "skipped" in data["ray"] or "0ms" in data["ray"]


def test_turns_rotate_who_goes_first_and_leave_the_first_round_out():
    order: list[str] = []
    runs = {name: (lambda name=name: order.append(name) or float(len(order))) for name in "abc"}
    seconds = dispatch._take_turns(runs, 3)
    assert order == list("abc" "bca" "cab" "abc")
    assert seconds == {"a": [6.0, 8.0, 10.0], "b": [4.0, 9.0, 11.0], "c": [5.0, 7.0, 12.0]}


@pytest.mark.slow
def test_bench_dispatch_hosts_small(tmp_path):
    from click.testing import CliRunner

    from pathdask.cli import main

    out = CliRunner().invoke(main, ["bench", "dispatch", "--hosts", "2,3", "--small", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "95% at" in out.output
    data = json.loads((tmp_path / "dispatch-hosts.json").read_text())
    assert set(data["hosts"]) == {"2", "3"}
    for result in data["hosts"].values():
        assert set(result["reaches_95pct_of_multicontroller_at_s"]) == {"OpByOp", "Chained"}
        parts = result["scheduler_cpu_per_call_by_part_s"]
        assert result["scheduler_cpu_per_call_s"] == pytest.approx(sum(parts.values()))
        assert parts["keys"] > 0 and parts["slot"] > 0 and parts["ended"] > 0 and parts["forgotten"] > 0
        apart = result["scheduler_cpu_per_call_apart_by_part_s"]  # the scheduler on a thread (and CPU) of its own
        assert result["scheduler_cpu_per_call_apart_s"] == pytest.approx(sum(apart.values()))
        assert set(apart) == set(parts) and apart["slot"] > 0 and apart["ended"] > 0
        assert result["scheduler_cpu_apart_on"] in (None, *os.sched_getaffinity(0))
        switching = result["scheduler_cpu_per_call_switching_by_part_s"]  # the same window, the GIL shared
        assert result["scheduler_cpu_per_call_switching_s"] == pytest.approx(sum(switching.values()))
        assert set(switching) == set(parts) and switching["slot"] > 0
        rates = result["rates"]["pathdask OpByOp"]
        assert rates and all(r > 0 for r in rates.values())
    bad = CliRunner().invoke(main, ["bench", "dispatch", "--hosts", "two"])
    assert bad.exit_code != 0 and "host counts" in bad.output


def test_bench_roundtrip_small(tmp_path):
    """Every station of a waiting call's path is timed, in the client, scheduler and host
    processes, in path order; the round trip is held against Dask's in the same run."""
    from pathdask import stopwatch
    from pathdask.bench import roundtrip

    result = roundtrip.run(roundtrip.Config.small(), out=str(tmp_path), echo=lambda s: None)
    data = json.loads((tmp_path / "roundtrip.json").read_text())
    assert data["dask_submit_result_ms"] > 0
    assert len(data["kinds"]) == 2
    for kind in data["kinds"].values():
        stations = [row["station"] for row in kind["stations"]]
        assert set(stations) == set(stopwatch.STATIONS), stations
        assert stations[0] == "call" and stations[-1] == "result"
        assert stations.index("taken") < stations.index("ordered") < stations.index("run") < stations.index("ran")
        at = [row["at_ms"] for row in kind["stations"]]
        assert at == sorted(at) and at[-1] <= kind["round_trip_ms"] * 1.5
        assert kind["ratio_to_dask"] == pytest.approx(kind["round_trip_ms"] / data["dask_submit_result_ms"])
    assert stopwatch.marks() == []  # off again
    assert result["kinds"] == data["kinds"]


@pytest.mark.slow
def test_bench_tenancy_small(tmp_path):
    from pathdask.bench import tenancy

    cfg = tenancy.Config.small()
    result = tenancy.run(cfg, out=str(tmp_path), echo=lambda s: None, processes=False)
    data = json.loads((tmp_path / "tenancy.json").read_text())
    assert (tmp_path / "tenancy.html").stat().st_size > 10_000
    assert len(data["figure9"]) == len(cfg.weights)
    for run, weights in zip(data["figure9"], cfg.weights):
        assert run["weights"] == list(weights)
        assert sum(run["share"]) == pytest.approx(1.0)
        assert all(s > 0 for s in run["share"])  # every client got device time
    for by_clients in data["figure8"].values():
        assert set(by_clients) == {str(n) for n in cfg.clients}
        assert all(v > 0 for v in by_clients.values())
    assert result["ratios"]["aggregate_over_single_client"]


def test_waiting_tenants_on_part_of_an_island_share_the_same_devices(monkeypatch):
    """As Figure 8's clients share one island: the resource manager alone would spread
    small meshes over the least-loaded devices (calibration measures on part of an island)."""
    import pathdask as pw
    from pathdask.bench import tenancy

    used = []
    warm_up = tenancy._warm_up

    def recorded(client, devices, prog):
        x = warm_up(client, devices, prog)
        used.append(x.mesh.device_ids)
        return x

    monkeypatch.setattr(tenancy, "_warm_up", recorded)
    topo = pw.Topology(islands=1, hosts_per_island=2, devices_per_host=2)
    with pw.LocalSystem(topo, processes=False, dashboard_address=None) as system:
        assert tenancy._throughput(system, 3, 0.0, 0.2, devices=2) > 0
    assert used == [(0, 1)] * 3


@pytest.mark.slow
def test_bench_datapath_small(tmp_path):
    """As CI runs it: the client, the scheduler and each host in processes of their own."""
    from pathdask.bench import datapath

    result = datapath.run(datapath.Config.small(), out=str(tmp_path), echo=lambda s: None)
    data = json.loads((tmp_path / "datapath.json").read_text())
    for op in ("put", "result", "reshard", "all_gather", "loopback TCP", "memcpy"):
        assert all(v > 0 for v in data["gb_per_s"][op].values()), op
    assert set(data["over_loopback_tcp"]) == {"put", "result", "reshard", "all_gather"}
    assert set(result["peak_rss_bytes"]) == {"client", "scheduler", "host 0", "host 1"}
    assert all(v > 0 for v in result["peak_rss_bytes"].values())
    memory = data["memory_during_put"]
    assert memory["array_bytes"] == 8 * 2**20 and memory["client_over_array"] >= 1
    assert (tmp_path / "datapath.html").exists()



@pytest.mark.slow
def test_bench_checkpoint_small(tmp_path, capsys):
    from pathdask.bench import checkpoint

    result = checkpoint.run(checkpoint.Config.small(), out=str(tmp_path), echo=print, folder=str(tmp_path))
    printed = capsys.readouterr().out
    assert "blocked s" in printed and "checkpoint (async)" in printed and "suspend (sync)" in printed
    data = json.loads((tmp_path / "checkpoint.json").read_text())
    assert all(v > 0 for v in data["gb_per_s"].values())
    assert set(result["ratios"]) == {"suspend_over_numpy_save", "resume_over_numpy_load",
                                     "checkpoint_blocked_over_suspend_blocked",
                                     "round_with_checkpoint_over_round_with_suspend",
                                     "round_with_checkpoint_over_round_without"}
    loop = data["training_loop_s"]
    assert set(loop) == {"no checkpoint", "suspend (sync)", "checkpoint (async)"}
    assert loop["no checkpoint"]["blocked"] < loop["checkpoint (async)"]["blocked"] < loop["suspend (sync)"]["blocked"]
    assert data["checkpoint_committed_after_s"] > loop["checkpoint (async)"]["blocked"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]  # the checkpoints are gone


@pytest.mark.slow
def test_bench_dashboard_small(tmp_path, capsys):
    from pathdask.bench import dashboard

    cfg = dashboard.Config(gangs=300, repeats=2)
    result = dashboard.run(cfg, out=str(tmp_path), echo=print, processes=False)
    data = json.loads((tmp_path / "dashboard.json").read_text())
    assert data["devices"] == 8 and data["gangs_recorded"] >= 300
    routes = {r["route"] for r in data["routes"]}
    assert routes == {f"/pathdask/{p}{v}" for p in ("", "api/") for v in dashboard.VIEWS}
    assert all(0 < r["median_ms"] <= r["max_ms"] for r in data["routes"])
    assert all(n > 0 for n in result["calls"].values())
    assert "/pathdask/api/timeline" in capsys.readouterr().out  # the table of figures is printed


@pytest.mark.slow
def test_bench_pipeline_small(tmp_path):
    """Every row runs (SPMD, pipelines, islands, data parallel), on a model whose modelled
    time is small enough for CI; the ratios and both traces are written."""
    from pathdask.bench import pipeline

    result = pipeline.run(pipeline.Config.small(), out=str(tmp_path), echo=lambda s: None)
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {"SPMD", "pipeline S=2 M=8", "pipeline S=2 M=8, 2 islands", "data parallel, 1 island",
                         "data parallel, 2 islands"}
    assert rows["pipeline S=2 M=8"]["bubble"] == pytest.approx(8 / 9)
    assert all(r["tokens_per_s"] > 0 and r["efficiency"] <= 1.0 for r in rows.values())
    assert set(result["ratios"]) >= {"dp_two_islands_over_one", "worst_pipeline_vs_bubble",
                                     "pipeline_S2_2_islands_over_one", "dcn_s_per_step_over_step_s"}
    assert result["ratios"]["dcn_s_per_step_over_step_s"] > 0  # gradients really crossed DCN
    saved = json.loads((tmp_path / "pipeline.json").read_text())
    assert saved["ratios"] == pytest.approx(result["ratios"])
    for name in ("pipeline-trace.html", "dcn-overlap.html"):
        assert "Bokeh" in (tmp_path / name).read_text()


def test_a_multicontroller_run_missing_a_host_times_out_and_leaves_nothing(client):
    """The baseline has no scheduler to end programs whose peer never came: past its timeout a
    host drops them and says so, rather than wait for ever."""
    import numpy as np

    import pathdask as pw
    from pathdask.bench.multicontroller import _host_loop
    from pathdask.client.lowering import lower

    step = pw.function(lambda b: pw.psum(b, "x"), in_specs=pw.P("x"), out_specs=pw.P("x"), name="sum")

    @pw.program
    def once(x):
        return step(x)

    mesh = client.mesh({"x": 4}, island=0)
    assert len(mesh.hosts) == 2
    x = client.put(np.ones(4), mesh, pw.P("x"))
    program = once.trace(x)
    plans = lower(program)
    alone = sorted(plans)[0]  # its peer never registers the programs
    with pytest.raises(Exception, match=r"did not end on host .* within 0\.5s"):
        client.dask.run(_host_loop, plans, (x.key,), 2, "mc-alone", program.outputs[0], 0.5, workers=[alone])
    assert client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].ledger.idle(), workers=[alone]) \
        == {alone: True}
