"""A node: its authoritative budget, live monitors, image layers, workload runtime and agent."""
