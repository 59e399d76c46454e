"""Reaching a node's authoritative admission: the node-client port and its drivers."""

from berth.nodeclient.agents import AgentNodes
from berth.nodeclient.local import LocalNodes
from berth.nodeclient.port import AgentClient, NodeClient
from berth.nodeclient.recording import RecordingNodes

__all__ = ["AgentClient", "AgentNodes", "LocalNodes", "NodeClient", "RecordingNodes"]
