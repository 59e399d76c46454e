"""The trace-driven simulator: workloads, the discrete-event simulator and its reports."""
