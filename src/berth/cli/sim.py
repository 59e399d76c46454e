"""``berth sim`` and ``berth demo``: the simulator and the policy comparison on the command line.

This module owns the two commands' flags, their validation and their terminal output; the
simulation is :mod:`berth.sim.simulator`, the figures :mod:`berth.sim.report`.  It exposes
:func:`register`, which adds both commands to a typer app (berth's own, in
:mod:`berth.cli`, or a fresh one in tests), so the CLI module does not grow a second concern.

* ``berth sim`` runs one or all policies on the same seeded workload, with a progress bar,
  prints the comparison table and writes ``report.json`` and the plots to ``--out``.
  ``--scenario NAME`` runs a scenario of the suite (:mod:`berth.sim.scenarios`) instead of
  the flags' configuration; ``--scenario all`` runs every one, writing
  ``--out/<scenario>/report.json`` (and plots), then ``--out/suite.md`` and
  ``--out/suite.json`` with every scenario × policy; ``--quick`` runs the scenarios at a
  fraction of their size.  The configuration flags (``--nodes`` …) cannot be combined with
  ``--scenario``: a scenario *is* a configuration.
* ``berth demo`` is the short fixed scenario the README starts with (50 nodes, 500
  placements): a few placements with every node's verdict, then the comparison table and where
  the plots went.

**One definition of the options.**  Every flag of ``berth sim`` sets a field of
:class:`~berth.sim.simulator.SimConfig` (or of its :class:`~berth.sim.workload.WorkloadConfig`)
and takes its default from that model's default (:data:`SIM_DEFAULTS`), so the command line
and the library cannot disagree; the bounds are the models' too — a flag is only parsed here,
then validated by the model, whose ``Invalid`` names the field, which :data:`_FLAGS` turns back
into the flag the user typed.

Bad flags (negative counts, an unknown policy, negative staleness, malformed sizes) print one
line on stderr and exit with status 2 — here, so the behaviour does not depend on which app
the commands are registered on.  Counts have the models' ceilings (``SimConfig.nodes`` ≤
10,000, ``requests`` ≤ 1,000,000, ``concurrency`` ≤ 64).  ``--out`` is checked before any
work — not empty, not a file or under one, creatable and writable — so a typo costs a
second, not a simulation.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from berth.cli.common import show_table
from berth.errors import BerthError, Invalid
from berth.scheduler.multinode import ClusterScheduler
from berth.scheduler.policy import POLICIES
from berth.scheduler.policy import policy as make_policy
from berth.sim.report import (
    Report,
    comparison_table,
    suite_markdown,
    suite_table,
    write_outputs,
)
from berth.sim.scenarios import SCENARIOS, Scenario, run_scenario, scenario
from berth.sim.simulator import Decision, SimConfig, SimResult, Simulation, simulate_policies
from berth.sim.workload import Arrival, WorkloadConfig, generate_workload
from berth.units import INFORMATION_UNITS, format_information
from berth.validation import one_line, shown

__all__ = [
    "DEMO_CONFIG",
    "SIM_DEFAULTS",
    "output_directory",
    "parse_policies",
    "register",
    "sim_config",
]

console = Console()
errors = Console(stderr=True)

# Config fields → the flags that set them, so an error names what the user typed.
_FLAGS = {
    "nodes": "--nodes",
    "requests": "--requests",
    "rate": "--rate",
    "lifetime_mean": "--lifetime",
    "flatten": "--flatten",
    "concurrency": "--concurrency",
    "staleness": "--staleness",
    "seed": "--seed",
    "cache_bytes": "--cache",
    "pull_bandwidth": "--pull-bandwidth",
    "registry_bandwidth": "--registry-bandwidth",
    "preseed_layers": "--preseed",
    "max_refusals": "--max-refusals",
    "scenario": "--scenario",
    "quick": "--quick",
    "boot_seconds": "--boot",
    "assume": "--assume",
    "policy": "--policy",
    "arrival": "--arrival",
    "out": "--out",
}

SIM_DEFAULTS = SimConfig()
"""The defaults of every ``berth sim`` flag: those of ``SimConfig`` and its workload."""
_WORKLOAD_DEFAULTS = SIM_DEFAULTS.workload


def _quantity(value: int, suffix: str = "") -> str:
    """``value`` bytes in the largest unit that holds it exactly (``8GiB``, ``125MBps``)."""
    units = sorted(INFORMATION_UNITS.items(), key=lambda item: item[1], reverse=True)
    for unit, size in units:
        if value and value % size == 0:
            return f"{value // size}{unit}{suffix}"
    return f"{value}B{suffix}"


DEMO_CONFIG = SimConfig(
    nodes=50,
    workload=WorkloadConfig(requests=500, rate=4.0, lifetime_mean=120.0, seed=7),
    seed=7,
)
"""``berth demo``'s fixed scenario: 50 nodes, 500 requests at 4/s living ~2 minutes."""


@contextmanager
def _clean_errors() -> Iterator[None]:
    """Turn a berth error into one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except Invalid as error:
        flag = _FLAGS.get((error.field or "").removeprefix("workload."), error.field)
        text = f"{flag}: {error.message}" if flag else error.message
        errors.print(
            f"[bold red]error:[/] {escape(one_line(text))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    except BerthError as error:
        errors.print(
            f"[bold red]error:[/] {escape(one_line(str(error)))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None


def output_directory(text: str, *, field: str = "out") -> Path:
    """The directory ``text`` names, created and known to be writable — before any work.

    ``Invalid`` naming ``field`` when ``text`` is empty, is a file, lies under a file, or
    cannot be created or written (no permission, a read-only disk).
    """
    if not isinstance(text, str | os.PathLike) or not str(text).strip():
        raise Invalid("must name a directory, got an empty path", field=field)
    if "\0" in str(text):
        raise Invalid(f"not a path: {shown(str(text))}", field=field)
    path = Path(text)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            where = "is" if part == path else f"lies under {shown(str(part))}, which is"
            raise Invalid(f"{shown(str(path))} {where} a file, not a directory", field=field)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise Invalid(
            f"cannot write into {shown(str(path))}: {error.strerror or error}", field=field
        ) from None
    return path


def parse_policies(text: str) -> list[str]:
    """``all`` → every registered policy; else a comma-separated list of names."""
    if text.strip() == "all":
        return list(POLICIES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise Invalid("name at least one policy, or 'all'", field="policy")
    for name in names:
        make_policy(name)
    return list(dict.fromkeys(names))


def sim_config(
    *,
    nodes: int,
    requests: int,
    rate: float,
    lifetime: float,
    arrival: Literal["poisson", "bursty"],
    flatten: float,
    concurrency: int,
    staleness: float,
    seed: int,
    cache: str,
    pull_bandwidth: str,
    boot: float,
    assume: bool = SIM_DEFAULTS.assume,
    registry_bandwidth: str | None = None,
    preseed: int = SIM_DEFAULTS.preseed_layers,
    max_refusals: int = SIM_DEFAULTS.max_refusals,
) -> SimConfig:
    """A validated ``SimConfig`` from flag values (``Invalid`` names the offending field).

    ``cache`` ``auto`` sizes each node's cache from its disk; an empty one is ``Invalid``.
    """
    if not cache.strip():
        raise Invalid("must be a size such as 4GiB, or auto", field="cache_bytes")
    workload = WorkloadConfig(
        requests=requests,
        rate=rate,
        lifetime_mean=lifetime,
        arrival=arrival,
        flatten=flatten,
        seed=seed,
    )
    return SimConfig(
        nodes=nodes,
        concurrency=concurrency,
        staleness=staleness,
        assume=assume,
        seed=seed,
        cache_bytes=None if cache.strip() == "auto" else cache,  # parsed by the model
        pull_bandwidth=pull_bandwidth,
        registry_bandwidth=(
            SIM_DEFAULTS.registry_bandwidth if registry_bandwidth is None else registry_bandwidth
        ),
        preseed_layers=preseed,
        max_refusals=max_refusals,
        boot_seconds=boot,
        workload=workload,
    )


def _run_all(
    config: SimConfig, names: list[str], arrivals: list[Arrival], quiet: bool
) -> dict[str, SimResult]:
    """Every policy on the same arrivals, under a rich progress bar (one line a policy)."""
    with _progress(quiet) as progress:
        return simulate_policies(config, names, arrivals=arrivals, progress=_stepper(progress))


def _print_summary(report: Report, out: Path) -> None:
    unserved = report.unserved_platforms
    if unserved:
        listing = ", ".join(f"{platform} ×{count}" for platform, count in unserved.items())
        count = sum(unserved.values())
        console.print(
            f"{count} request{'' if count == 1 else 's'} for platforms no node runs "
            f"({listing}): refused by every policy as NoMatchingPlatform"
        )
    goals = report.goals
    if goals:
        regime = report.regime
        load = (
            ""
            if regime is None
            else f"{regime.name}: offered load {regime.offered_load:.2f}, "
            f"peak {regime.peak_offered_load:.2f}"
        )
        console.print(f"goals for the berth policy ({load}):")
        for name, value in goals.items():
            mark = "[green]met[/]" if value["met"] else "[red]not met[/]"
            missed = "" if value["met"] else f", missed by {value['missed_by']:.3g}"
            console.print(
                f"  {name}: {mark} ({value['figure']:.4g} {value['unit']}, target "
                f"{value['target']:.4g}{missed})"
            )
    console.print(f"report: {out / 'report.json'}")
    for path in report.plots.values():
        console.print(f"plot:   {path}")


OutOption = Annotated[str, typer.Option(help="Directory for report.json and plots.")]
QuietOption = Annotated[bool, typer.Option(help="No progress bar.")]


def sim(
    nodes: Annotated[
        int, typer.Option(help="Number of nodes (mixed sizes and platforms).")
    ] = SIM_DEFAULTS.nodes,
    requests: Annotated[
        int, typer.Option(help="Number of arrivals.")
    ] = _WORKLOAD_DEFAULTS.requests,
    rate: Annotated[
        float, typer.Option(help="Mean arrivals per simulated second.")
    ] = _WORKLOAD_DEFAULTS.rate,
    lifetime: Annotated[
        float, typer.Option(help="Mean workload lifetime (s).")
    ] = _WORKLOAD_DEFAULTS.lifetime_mean,
    arrival: Annotated[
        Literal["poisson", "bursty"], typer.Option(help="Arrival process.")
    ] = _WORKLOAD_DEFAULTS.arrival,
    flatten: Annotated[
        float, typer.Option(help="Image popularity ∝ pulls**flatten (1: as Docker Hub, 0: flat).")
    ] = _WORKLOAD_DEFAULTS.flatten,
    policy: Annotated[
        str, typer.Option(help=f"all, or comma-separated names: {', '.join(POLICIES)}.")
    ] = "all",
    concurrency: Annotated[
        int, typer.Option(help="K concurrent schedulers.")
    ] = SIM_DEFAULTS.concurrency,
    staleness: Annotated[
        float, typer.Option(help="Δ: seconds before a node's snapshot reaches schedulers.")
    ] = SIM_DEFAULTS.staleness,
    assume: Annotated[
        bool,
        typer.Option(
            help="Schedulers count their own confirmed placements until a snapshot shows them "
            "(--no-assume: only what the snapshots say)."
        ),
    ] = SIM_DEFAULTS.assume,
    seed: Annotated[
        int, typer.Option(help="Seed of the workload, node layout, policies.")
    ] = SIM_DEFAULTS.seed,
    cache: Annotated[
        str, typer.Option(help="Per-node layer cache; auto: a share of the node's disk.")
    ] = "auto",
    pull_bandwidth: Annotated[
        str, typer.Option(help="A node's pull bandwidth, shared by its concurrent pulls.")
    ] = _quantity(SIM_DEFAULTS.pull_bandwidth, "ps"),
    registry_bandwidth: Annotated[
        str, typer.Option(help="The registry's bandwidth, shared by every node.")
    ] = _quantity(SIM_DEFAULTS.registry_bandwidth, "ps"),
    preseed: Annotated[
        int, typer.Option(help="Layers every node starts with (its platform's most used).")
    ] = SIM_DEFAULTS.preseed_layers,
    max_refusals: Annotated[
        int, typer.Option(help="A placement gives up at this many refusals.")
    ] = SIM_DEFAULTS.max_refusals,
    boot: Annotated[
        float, typer.Option(help="Fixed boot time added to starts (s).")
    ] = SIM_DEFAULTS.boot_seconds,
    scenario_name: Annotated[
        str | None,
        typer.Option(
            "--scenario",
            help=f"Run a scenario of the suite instead: {', '.join(SCENARIOS)}, or all.",
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="With --scenario: each scenario at a fraction of its size.")
    ] = False,
    out: OutOption = "berth-sim-out",
    quiet: QuietOption = False,
) -> None:
    """Compare placement policies on a simulated cluster fed by Docker Hub image layers."""
    given: dict[str, Any] = {
        "nodes": nodes,
        "requests": requests,
        "rate": rate,
        "lifetime": lifetime,
        "arrival": arrival,
        "flatten": flatten,
        "concurrency": concurrency,
        "staleness": staleness,
        "seed": seed,
        "cache": cache,
        "pull_bandwidth": pull_bandwidth,
        "boot": boot,
        "assume": assume,
        "registry_bandwidth": registry_bandwidth,
        "preseed": preseed,
        "max_refusals": max_refusals,
    }
    with _clean_errors():
        names = parse_policies(policy)
        if scenario_name is not None:
            _run_scenarios(scenario_name, quick, given, names, out, quiet)
            return
        if quick:
            raise Invalid("only applies with --scenario", field="quick")
        config = sim_config(**given)
        directory = output_directory(out)
        arrivals = generate_workload(config.workload)
        results = _run_all(config, names, arrivals, quiet)
        report = write_outputs(results, directory)
    show_table(comparison_table(report, title=_title(config)))
    _print_summary(report, directory)


_DEFAULT_FLAGS = {
    name: param.default
    for name, param in inspect.signature(sim).parameters.items()
    if name not in ("policy", "scenario_name", "quick", "out", "quiet")
}


def _run_scenarios(
    name: str,
    quick: bool,
    given: dict[str, Any],
    policies: list[str],
    out: str,
    quiet: bool,
) -> None:
    """``berth sim --scenario NAME|all``: one scenario, or the suite and its summary table."""
    for flag, value in given.items():
        if value != _DEFAULT_FLAGS[flag]:
            option = "--" + flag.replace("_", "-")
            if flag == "assume":
                option = "--no-assume"
            raise Invalid(f"{option} cannot be combined with --scenario", field="scenario")
    text = name.strip()
    chosen: list[Scenario] = (
        [scenario(each, quick=quick) for each in SCENARIOS]
        if text == "all"
        else [scenario(text, quick=quick)]
    )
    directory = output_directory(out)
    reports: dict[str, Report] = {}
    for each in chosen:
        target = directory if len(chosen) == 1 else directory / each.name
        console.rule(f"[bold]{each.name}[/]: {each.summary}")
        with _progress(quiet) as progress:
            step = _stepper(progress)
            _, report = run_scenario(each, policies, out=target, progress=step)
        reports[each.name] = report
        show_table(comparison_table(report, title=_title(each.config)))
        _print_summary(report, target)
    if len(chosen) > 1:
        show_table(suite_table(reports))
        (directory / "suite.md").write_text(suite_markdown(reports))
        summary = {name: report.to_dict() for name, report in reports.items()}
        (directory / "suite.json").write_text(json.dumps(summary, indent=2) + "\n")
        console.print(f"suite: {directory / 'suite.md'}, {directory / 'suite.json'}")


def _stepper(progress: Progress) -> Callable[[str, int, int], None]:
    """A ``progress(policy, done, total)`` callback drawing one bar per policy."""
    tasks: dict[str, Any] = {}

    def step(policy: str, done: int, total: int) -> None:
        if policy not in tasks:
            tasks[policy] = progress.add_task(policy, total=total)
        if done % 50 == 0 or done == total:
            progress.update(tasks[policy], completed=done)

    return step


def _progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )


def _title(config: SimConfig) -> str:
    workload = config.workload
    return (
        f"{config.nodes} nodes, {workload.requests} requests at {workload.rate:g}/s "
        f"(lifetime ~{workload.lifetime_mean:g} s), K={config.concurrency}, "
        f"Δ={config.staleness:g} s, seed {config.seed}" + ("" if config.assume else ", no assume")
    )


def _explain(decision: Decision, arrival: Arrival, scheduler: ClusterScheduler) -> Table:
    """Every node's verdict on one request, best rank first (the top few and the chosen one)."""
    request = arrival.request
    explanation = scheduler.explain(request)
    states = scheduler.states()
    ids = {layer.id: layer.size for layer in request.layers}
    image_bytes = sum(ids.values())
    table = Table(
        title=(
            f"#{decision.index} {request.key} ({arrival.instance_type}, "
            f"{len(ids)} layers, {format_information(image_bytes)}) → [bold]{decision.node}[/]"
        ),
        title_justify="left",
        caption=(
            f"{explanation.summary()}; pulled {format_information(decision.pulled_bytes)}, "
            f"starts after {decision.start_latency or 0:.2f} s"
        ),
        caption_justify="left",
    )
    for column in ("rank", "node", "verdict", "mounted", "cached", "mem free"):
        table.add_column(column, justify="left" if column in ("node", "verdict") else "right")
    shown = 0
    for verdict in explanation.verdicts:
        chosen = verdict.node == decision.node
        if shown >= 4 and not chosen:
            continue
        state = states[verdict.node]
        cached = sum(size for layer_id, size in ids.items() if layer_id in state.cached_layers)
        table.add_row(
            "–" if verdict.rank is None else str(verdict.rank),
            f"[bold]{verdict.node}[/]" if chosen else verdict.node,
            verdict.description,
            format_information(verdict.colocated_bytes),
            format_information(cached),
            format_information(state.mem_free),
        )
        shown += 1
    return table


def demo(
    out: OutOption = "berth-demo-out",
    quiet: QuietOption = False,
    runtime: Annotated[
        str,
        typer.Option(
            help="simulated (the policy comparison) or microvm (real guests, embedded cluster)."
        ),
    ] = "simulated",
) -> None:
    """A short fixed scenario: explained placements, then the policy comparison."""
    with _clean_errors():
        if runtime == "microvm":
            from berth.cli.demo_microvm import show

            show(console)
            return
        if runtime != "simulated":
            raise Invalid(
                f"must be 'simulated' or 'microvm', got {shown(runtime)}", field="--runtime"
            )
        directory = output_directory(out)
        config = DEMO_CONFIG
        arrivals = generate_workload(config.workload)
        console.rule("[bold]berth demo[/]: 50 nodes, 500 placements, real Docker Hub layers")
        console.print(
            "Each request is ranked by the berth policy from the scheduler's replica of the node "
            "snapshots — layer bytes already on a node (mounted or cached) first, plus its free "
            "memory priced by how full the cluster is — then confirmed by the chosen node's own "
            "budget.  A few decisions (rank 0 is tried first):"
        )
        tables = _explained_placements(config, arrivals)
        for table in tables:
            show_table(table)
        console.print("Now every policy on the same 500 arrivals:")
        results = _run_all(config, list(POLICIES), arrivals, quiet)
        report = write_outputs(results, directory)
    show_table(comparison_table(report, title=_title(config)))
    _print_summary(report, directory)
    console.print(
        "next: berth sim --scenario all --quick (every scenario), or a real local cluster: "
        "berth up, which prints a first berth run to try (README: A local cluster in one "
        "command)",
        highlight=False,
    )


def _explained_placements(config: SimConfig, arrivals: list[Arrival]) -> list[Table]:
    """Run the berth policy once, explaining the first placement and a few that reused layers."""
    tables: list[Table] = []
    images: set[str] = set()

    def wanted(decision: Decision) -> bool:
        if decision.index == 0:
            return True
        return (
            decision.index >= len(arrivals) // 3
            and decision.local_bytes > 0
            and decision.pulled_bytes > 0
            and decision.image not in images
        )

    def observe(decision: Decision, arrival: Arrival, scheduler: ClusterScheduler) -> None:
        if decision.placed and len(tables) < 3 and wanted(decision):
            images.add(decision.image)
            tables.append(_explain(decision, arrival, scheduler))

    Simulation(config, "berth", arrivals).run(observer=observe)
    return tables


def register(app: typer.Typer) -> None:
    """Add ``sim`` and ``demo`` to ``app``."""
    app.command("sim")(sim)
    app.command("demo")(demo)
