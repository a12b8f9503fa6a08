"""The runtime: runs and the run lock, the cycle, the tool pipeline, breakers, approvals, triggers, the monitor's tick, observing and reporting."""
