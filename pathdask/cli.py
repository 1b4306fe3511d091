"""The ``pathdask`` command line: a click group; each subcommand only parses its options.

Add a subcommand with ``@main.command()`` here, and keep its logic in its own
module (as ``demo`` keeps it in :mod:`pathdask.demo`).
"""

from __future__ import annotations

import click

from . import SliceTooLargeError, TopologyError, __version__
from .protocol import Diagnose, ask


class _Group(click.Group):
    """Ctrl-C ends any command with one line: the embedded cluster has been shut down in order
    by then (its worker processes ignore SIGINT and leave with it)."""

    def invoke(self, ctx: click.Context) -> object:
        from .interrupts import reliable_interrupts

        try:
            with reliable_interrupts():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("Interrupted; the cluster was shut down.", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pathdask")
def main() -> None:
    """pathdask: Pathways-style single-controller sharded computation on Dask."""


@main.command()
@click.option("--topology", default=None,
              help="Topology YAML file, or a packaged topology's name.  [default: local, 2 islands x 2 hosts x 2 devices]")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Training steps.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the data and initial weights.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--elastic", is_flag=True,
              help="Kill a training host mid-run: the loop re-meshes and resumes from its checkpoint.")
def demo(topology: str | None, steps: int, processes: bool, seed: int, progress: bool, elastic: bool) -> None:
    """Train a sharded MLP on an embedded cluster and check it against NumPy."""
    from .demo import run_demo

    try:
        if elastic:
            from .demo_elastic import run_elastic_demo

            if not processes:
                raise click.UsageError("--elastic kills a worker process: it needs --processes")
            if not run_elastic_demo(topology, steps=steps, seed=seed, progress=progress, echo=click.echo)["ok"]:
                raise click.ClickException("the final loss does not match NumPy's")
            return
        report = run_demo(topology, steps=steps, processes=processes, seed=seed, progress=progress,
                          echo=click.echo)
    except (SliceTooLargeError, TopologyError) as e:  # the user can fix these: no traceback
        raise click.ClickException(str(e)) from e
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("graphs"):
            raise
        raise click.ClickException(str(e)) from e
    if not report.ok:
        raise click.ClickException(f"the sharded result does not match NumPy. {report.message}")


@main.command()
@click.argument("address")
@click.option("--timeout", default="10s", show_default=True, help="How long to wait for the scheduler.")
def doctor(address: str, timeout: str) -> None:
    """Print what every device of a running system does or waits for, and every client's queue.

    ADDRESS is the Dask scheduler's address, e.g. tcp://127.0.0.1:8786.
    """
    from distributed import Client as DaskClient

    from .diagnosis import Diagnosis

    try:
        with DaskClient(address, timeout=timeout, set_as_default=False) as dask_client:
            reply = dask_client.sync(ask, dask_client.scheduler, Diagnose())
    except OSError as e:
        raise click.ClickException(f"cannot reach the scheduler at {address}: {e}") from e
    if not isinstance(reply, dict):
        raise click.ClickException(f"the scheduler at {address} does not run the pathdask plugin")
    click.echo(str(Diagnosis.from_reply(reply)))


@main.group()
def bench() -> None:
    """Benchmarks: pathdask and its baselines in one run; a table, JSON and plots."""


@bench.command("dispatch")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON and HTML.")
@click.option("--topology", default=None,
              help="Topology YAML file, or a packaged topology's name.  [default: local]")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Runs per measurement (best kept).  [default: 15 rounds for Figure 5, 3 for the rest]")
@click.option("--ray/--no-ray", default=True, show_default=True, help="Include Ray where it is installed.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
@click.option("--pin/--no-pin", default=True, show_default=True,
              help="Each host's worker process on a CPU of its own, as on a machine of its own.")
@click.option("--hosts", default=None, metavar="N,N,...",
              help="Instead: for each number of hosts (e.g. 2,4,8,16; threads mode, one device per "
                   "host), the smallest computation at which pathdask reaches 95% of the multi-controller.")
@click.option("--netns", is_flag=True,
              help="Instead: the round trip and calls/s across network namespaces (one per machine, "
                   "dask CLI in each) with 0, 0.1 and 1 ms of delay on every link, beside the embedded "
                   "system. Needs root and iproute2 (and tc netem or /dev/net/tun for the delays).")
def bench_dispatch(small: bool, out: str, topology: str | None, repeats: int | None, ray: bool,
                   processes: bool, pin: bool, hosts: str | None, netns: bool) -> None:
    """Figures 5-7: dispatch throughput of pathdask, plain Dask and a multi-controller."""
    from .bench.dispatch import Config, run
    from .topology import Topology

    if netns:
        from .bench import netns as across
        from .netns import unavailable

        reason = unavailable()
        if reason:
            raise click.ClickException(f"--netns cannot run here: {reason}")
        ncfg = Config.small() if small else Config(computations=64, repeats=3, round_trips=100)
        if repeats:
            ncfg.repeats = repeats
        across.run(ncfg, Topology.load(topology) if topology else None, out=out, echo=click.echo)
        return

    if hosts is not None:
        from .bench import hosts as scaling

        counts = _host_counts(hosts)
        hcfg = scaling.Config.small(counts) if small else scaling.Config(hosts=counts)
        if repeats:
            hcfg.repeats = repeats
        scaling.run(hcfg, out=out, echo=click.echo)
        return
    cfg = Config.small() if small else Config()
    if repeats:
        cfg.repeats = cfg.figure5_repeats = repeats
    cfg.ray = cfg.ray and ray
    cfg.pin_hosts = pin
    run(cfg, Topology.load(topology) if topology else None, out=out, echo=click.echo, processes=processes)


def _host_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"expected host counts such as 2,4,8,16; got {text!r}", param_hint="--hosts")
    return counts


@bench.command("delayline")
@click.option("--small", is_flag=True, help="Fewer round trips and a smaller transfer.")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
def bench_delayline(small: bool, out: str) -> None:
    """What a link's delay really adds between two namespaces: round trips at 0, 0.1, 1 and 50 ms of
    one-way delay (netem, or the user-space delay line without it), and a transfer's throughput."""
    from .bench import delayline
    from .netns import unavailable

    reason = unavailable()
    if reason:
        raise click.ClickException(f"network namespaces cannot be used here: {reason}")
    delayline.run(out=out, echo_=click.echo, round_trips=50 if small else 300,
                  nbytes=(16 if small else 128) * 2**20)


@bench.command("roundtrip")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
@click.option("--topology", default=None,
              help="Topology YAML file, or a packaged topology's name.  [default: local]")
def bench_roundtrip(small: bool, out: str, topology: str | None) -> None:
    """Where a waiting call's round trip goes, station by station, beside Dask's submit().result()."""
    from .bench.roundtrip import Config, run
    from .topology import Topology

    run(Config.small() if small else Config(), Topology.load(topology) if topology else None, out=out,
        echo=click.echo)


@bench.command("tenancy")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON and HTML.")
@click.option("--topology", default=None,
              help="Topology YAML file, or a packaged topology's name.  [default: local]")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
def bench_tenancy(small: bool, out: str, topology: str | None, processes: bool) -> None:
    """Figures 8-9: proportional share between clients, and many clients at once."""
    from .bench.tenancy import Config, run
    from .topology import Topology

    run(Config.small() if small else Config(), Topology.load(topology) if topology else None, out=out,
        echo=click.echo, processes=processes)


@bench.command("datapath")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON and HTML.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
def bench_datapath(small: bool, out: str, processes: bool) -> None:
    """put, result, reshard and all-gather bandwidth beside loopback TCP and memcpy; peak memory."""
    from .bench.datapath import Config, run

    run(Config.small() if small else Config(), out=out, echo=click.echo, processes=processes)


@bench.command("checkpoint")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
@click.option("--folder", default=None, help="Where the checkpoints are written (default: a temporary folder).")
def bench_checkpoint(small: bool, out: str, folder: str | None) -> None:
    """Suspend and resume bandwidth (zarr, shard by shard) beside numpy.save and numpy.load;
    how long a training loop is blocked by an asynchronous checkpoint and by a suspend."""
    from .bench.checkpoint import Config, run

    run(Config.small() if small else Config(), out=out, echo=click.echo, folder=folder)


@bench.command("pipeline")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON and HTML.")
def bench_pipeline(small: bool, out: str) -> None:
    """Table 2 at our scale: SPMD, pipelines of 2-8 stages on 1, 2 and 4 islands, two-island data parallel."""
    from .bench.pipeline import Config, run

    run(Config.small() if small else Config(), out=out, echo=click.echo)


@bench.command("dashboard")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--gangs", type=click.IntRange(min=1), default=None, help="Gangs recorded before timing.  [default: 10000]")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
def bench_dashboard(small: bool, gangs: int | None, out: str, processes: bool) -> None:
    """How fast each dashboard page and JSON route answers with a full activity record."""
    from .bench.dashboard import Config, run

    cfg = Config.small() if small else Config()
    cfg.gangs = gangs or cfg.gangs
    run(cfg, out=out, echo=click.echo, processes=processes)


@bench.command("soak")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--clients", type=click.IntRange(min=1), default=None, help="Concurrent clients.")
@click.option("--programs", type=click.IntRange(min=1), default=None, help="Random programs per client.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
def bench_soak(small: bool, clients: int | None, programs: int | None, seed: int, out: str,
               processes: bool) -> None:
    """Many clients, random programs under proportional share; every result checked."""
    from .bench.soak import Config, run

    cfg = Config.small() if small else Config()
    cfg.clients = clients or cfg.clients
    cfg.programs = programs or cfg.programs
    cfg.seed = seed
    try:
        run(cfg, out=out, echo=click.echo, processes=processes)
    except AssertionError as e:
        raise click.ClickException(str(e)) from e


@bench.command("stress")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Fresh systems, one after another.")
@click.option("--seed", type=int, default=0, show_default=True, help="Run R draws from seed * 1000 + R.")
@click.option("--processes/--threads", default=False, show_default=True,
              help="Worker processes (and worker kills), or all hosts in this process.")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON.")
@click.option("--hang-seconds", type=click.FloatRange(min=1), default=None,
              help="No program ending for this long is a hang.  [default: 30]")
def bench_stress(small: bool, runs: int | None, seed: int, processes: bool, out: str,
                 hang_seconds: float | None) -> None:
    """Random clients, programs and chaos on fresh systems; no program may hang."""
    from .bench.stress import Config, run

    cfg = Config.small() if small else Config()
    cfg.runs = runs or cfg.runs
    cfg.seed, cfg.processes = seed, processes
    cfg.hang_seconds = hang_seconds or cfg.hang_seconds
    s = run(cfg, out=out, echo=click.echo)["summary"]
    if s["runs_with_hangs"] or s["wrong_results"] or s["runs_with_bytes_left"]:
        raise click.ClickException(
            f"{s['runs_with_hangs']} run(s) with hangs, {s['wrong_results']} wrong result(s), "
            f"{s['runs_with_bytes_left']} run(s) with bytes left; see {out}/stress.json")


@main.command("simulate")
@click.argument("what", type=click.Choice(["figure6", "figure8", "table2", "validate", "speed", "all"]),
                required=False)
@click.option("--calibrate", "do_calibrate", is_flag=True,
              help="Measure the control costs on the real embedded system and save them first.")
@click.option("--costs", default=None, help="A calibration JSON file.  [default: the one shipped with pathdask]")
@click.option("--small", is_flag=True, help="A small configuration (as CI runs it).")
@click.option("--programs", type=click.IntRange(min=1), default=1000, show_default=True,
              help="speed: programs of 128 gangs simulated on 2,048 devices.")
@click.option("--cpu", type=click.IntRange(min=-1), default=None,
              help="The CPU that calibration and validation run the embedded system on (-1: all).  "
                   "[default: the fastest]")
@click.option("--out", default="bench-results", show_default=True, help="Folder for JSON and HTML.")
def simulate_cmd(what: str | None, do_calibrate: bool, costs: str | None, small: bool, programs: int,
                 cpu: int | None, out: str) -> None:
    """Paper scale on a virtual clock: Figure 6 (configurations A and B), Figure 8, Table 2, the
    validation against real runs, and the simulation's speed."""
    from .simulate.cli import run_simulate

    if what is None and not do_calibrate:
        raise click.UsageError("name what to simulate (figure6, figure8, table2, validate, speed, all), "
                               "or --calibrate")
    run_simulate(what, do_calibrate, costs, small, programs, out, click.echo, cpu=cpu)


if __name__ == "__main__":
    main()
