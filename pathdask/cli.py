"""The ``pathdask`` command line: a click group; each subcommand only parses its options.

Add a subcommand with ``@main.command()`` here, and keep its logic in its own
module (as ``demo`` keeps it in :mod:`pathdask.demo`).
"""

from __future__ import annotations

import click

from . import SliceTooLargeError, TopologyError, __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pathdask")
def main() -> None:
    """pathdask: Pathways-style single-controller sharded computation on Dask."""


@main.command()
@click.option("--topology", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Topology YAML file.  [default: cluster/local.yaml, else 2 islands x 2 hosts x 2 devices]")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Training steps.")
@click.option("--processes/--threads", default=True, show_default=True,
              help="One worker process per host, or all hosts in this process.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the data and initial weights.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
def demo(topology: str | None, steps: int, processes: bool, seed: int, progress: bool) -> None:
    """Train a sharded MLP on an embedded cluster and check it against NumPy."""
    from .demo import run_demo

    try:
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


if __name__ == "__main__":
    main()
