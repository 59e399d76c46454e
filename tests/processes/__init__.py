"""Tests that start berth's own processes: ``berth up``, agents, the CLI, a browser."""
