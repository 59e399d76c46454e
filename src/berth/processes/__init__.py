"""The processes berth runs, each composed in one place.

A *process* reads its configuration, builds the drivers it runs from the ports' packages
(:mod:`berth.node`, :mod:`berth.nodeclient`, :mod:`berth.scheduler`, :mod:`berth.store`,
:mod:`berth.registry`, :mod:`berth.events`, :mod:`berth.api`), connects them and runs them
until it is told to stop.  Those packages hold ports, drivers and logic only; which of them a
process puts together, and how, is said here once:

- :mod:`berth.processes.agent` — the node agent (``berth agent --nats``): agents on NATS, one
  per configuration file;
- :mod:`berth.processes.scheduler` — the scheduler service (``berth scheduler``), with the HTTP
  API beside it (``--http``);
- :mod:`berth.processes.up` — ``berth up``: a local cluster of those processes and a
  nats-server, supervised;
- :mod:`berth.processes.lifetime` — how a process's run ends (a signal or a duration).

The CLI's commands (:mod:`berth.cli`) parse their flags and call these; the test clusters
(:mod:`berth.testing.cluster`) build the same services in one process.  Nothing below this
layer imports it (``tests/test_layout.py``).
"""
