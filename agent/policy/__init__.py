"""The policy: the rules a planner must obey (guards, lifecycle, sizing, limits, the policy table, claims, tool specs); it imports no planner."""
