""""Forbidden" is one test, ``agent.policy.table.is_forbidden``, for the pipeline, the monitor, the rules
planner and a parked launch at dispatch (docs/contract.md "Policy")."""

from agent.policy.table import DEFAULT_POLICY, is_forbidden


def test_forbidden_on_the_bare_tool_binds_every_actor_and_priority():
    table = {**DEFAULT_POLICY, "destroy_instance": "forbidden", "launch_instance": "forbidden"}
    assert is_forbidden("destroy_instance", {"instance_id": "v-1"}, table)
    assert is_forbidden("destroy_instance", {"instance_id": "v-1"}, table, "monitor")  # its own key says auto
    assert is_forbidden("launch_instance", {"launch_priority": "P0"}, table)  # its own key says auto
    assert is_forbidden("launch_instance", None, table)  # before the arguments parse


def test_a_priority_key_forbids_that_priority_only():
    table = {**DEFAULT_POLICY, "launch_instance:P2": "forbidden"}
    assert is_forbidden("launch_instance", {"launch_priority": "P2"}, table)
    assert not is_forbidden("launch_instance", {"launch_priority": "P1"}, table)
    assert not is_forbidden("launch_instance", None, table)  # unparsed: only the bare key can forbid
    assert not is_forbidden("launch_instance", {"launch_priority": "P2"}, table, "monitor")


def test_the_defaults_forbid_nothing():
    assert not any(is_forbidden(t.split(":")[0], None, DEFAULT_POLICY) for t in DEFAULT_POLICY)
