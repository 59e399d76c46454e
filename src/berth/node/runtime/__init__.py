"""Running workloads on a node: the runtime port and its drivers.

``port`` is the protocol (boot, stop, list, exit listeners); ``process`` runs real OS process
groups, ``fake`` runs nothing (tests, the simulator), ``microvm`` boots each workload in a
QEMU ``microvm`` guest from its image's layers (import it from its module: it brings the layer
files and OCI reading with it).  ``BootSpec`` and ``BootFailed`` are
:mod:`berth.boot`'s (the node client port speaks them too), re-exported here with the
port they are the signature of.  The contract every driver passes is
:mod:`berth.testing.runtime_contract`.
"""

from berth.node.runtime.fake import FakeRuntime
from berth.node.runtime.port import BootFailed, BootSpec, Runtime, WorkloadExit, WorkloadHandle
from berth.node.runtime.process import ProcessRuntime

__all__ = [
    "BootFailed",
    "BootSpec",
    "FakeRuntime",
    "ProcessRuntime",
    "Runtime",
    "WorkloadExit",
    "WorkloadHandle",
]
