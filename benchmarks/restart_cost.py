"""What a restart costs on the node: a workload that fails at once, restarted with no backoff
by its node until its attempts run out, over the real process runtime with a journal.

Each run is what a restart does in earnest: the journal entry rewritten with the new run's
locator, the supervisor's records of the last run removed, a supervisor and its workload
started (``sh -c 'exit 1'``), its exit reported — with the reservation and layers kept
throughout.  The figure is the wall time per run (a restart's overhead, the backoff aside)
and a check that the budget held one reservation all along and none after.

    python benchmarks/restart_cost.py             # 100 restarts
    python benchmarks/restart_cost.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from berth.model import Layer, RestartPolicy, Spec
from berth.node.budget import BudgetLimits, NodeBudget
from berth.node.core import NodeCore
from berth.node.journal import Journal
from berth.node.layers import LayerRegistry
from berth.node.runtime import BootSpec, ProcessRuntime
from berth.units import GiB, MiB


async def measure(restarts: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as directory:
        state_dir = Path(directory)
        limits = BudgetLimits(
            mem_max=2 * GiB, disk_max=10 * GiB, cpu_capacity=4, disk_bw_cap=GiB, net_bw_cap=GiB
        )
        core = NodeCore(
            "n1",
            "linux/amd64",
            NodeBudget(limits),
            ProcessRuntime(state_dir=state_dir),
            layers=LayerRegistry(GiB),
            journal=Journal(state_dir),
        )
        policy = RestartPolicy(mode="on-failure", attempts=restarts, delay_s=0.0, max_delay_s=0.0)
        boot = BootSpec(name="f", command=("sh", "-c", "exit 1"), restart=policy)
        spec = Spec(vcpus=0.1, mem=64 * MiB, disk=MiB)
        most_held = 0
        started = time.monotonic()
        await core.boot(spec, (Layer(id="base", size=1),), boot, workload_id="w-bench")
        while core.status("w-bench").state != "ended":
            most_held = max(most_held, len(core.budget.reservations()))
            await asyncio.sleep(0.001)
        elapsed_s = time.monotonic() - started
        status = core.status("w-bench")
        return {
            "restarts": status.restarts,
            "runs": status.restarts + 1,
            "elapsed_s": round(elapsed_s, 3),
            "ms_per_run": round(1000 * elapsed_s / (status.restarts + 1), 2),
            "most_reservations_held": most_held,
            "reservations_after": len(core.budget.reservations()),
            "exhausted": status.exhausted,
            "problems": core.problems(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="10 restarts (CI)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    options = parser.parse_args()
    result = asyncio.run(measure(10 if options.quick else options.restarts))
    if options.json:
        print(json.dumps(result))
        return
    print(
        f"{result['runs']} runs ({result['restarts']} restarts) in {result['elapsed_s']} s: "
        f"{result['ms_per_run']} ms per run; reservations held: at most "
        f"{result['most_reservations_held']}, after {result['reservations_after']}; "
        f"exhausted: {result['exhausted']}; problems: {result['problems'] or 'none'}"
    )


if __name__ == "__main__":
    main()
