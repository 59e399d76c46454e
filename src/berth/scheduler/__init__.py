"""Placement: the ``Scheduler`` port and its drivers.

``port`` defines the protocol; ``singlenode`` is the one-worker driver; the cluster driver
ranks many nodes by layer colocation and confirms through each node's own admission.
"""

from berth.scheduler.port import Scheduler
from berth.scheduler.singlenode import SingleNode

__all__ = ["Scheduler", "SingleNode"]
