"""berth — decides which node runs each workload, and makes the decision stick.

The public API lives here; submodules are organised by architecture (``scheduler`` for the
placement port and its drivers, ``node`` for a node's authoritative budget, ``cluster`` for
the replicated state store).
"""

from berth.errors import BerthError, Invalid, NoCapacity, NoMatchingPlatform, Unavailable
from berth.model import INSTANCE_TYPES, Layer, Placement, Request, Spec, instance_type
from berth.platform import Platform
from berth.scheduler import Scheduler, SingleNode
from berth.units import format_bandwidth, format_information, parse_bandwidth, parse_information

__all__ = [
    "INSTANCE_TYPES",
    "BerthError",
    "Invalid",
    "Layer",
    "NoCapacity",
    "NoMatchingPlatform",
    "Placement",
    "Platform",
    "Request",
    "Scheduler",
    "SingleNode",
    "Spec",
    "Unavailable",
    "format_bandwidth",
    "format_information",
    "instance_type",
    "parse_bandwidth",
    "parse_information",
]
