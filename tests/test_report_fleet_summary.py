"""The honest report's fleet line stays readable at 1,000 instances: each instance is
named in a small fleet; a large one is counted by status, with the odd ones out still named."""

from agent.runtime.report import fleet_summary


def test_a_small_fleet_names_each_instance():
    assert fleet_summary([("v-1", "running"), ("v-2", "exited")]) == "v-1 running, v-2 exited"
    assert fleet_summary([]) == "no instances"


def test_a_large_fleet_is_counted_by_status_and_names_the_odd_ones_out():
    live = [(f"v-{i}", "running") for i in range(1, 998)] + [("v-998", "exited"), ("v-999", "exited"),
                                                             ("v-1000", "loading")]
    line = fleet_summary(live)
    assert line == "1000 instances: 997 running; 2 exited (v-998, v-999); 1 loading (v-1000)"
    assert "v-5," not in line and len(line) < 120


def test_a_status_with_many_instances_is_only_counted():
    live = [(f"v-{i}", "running") for i in range(20)] + [(f"x-{i}", "exited") for i in range(6)]
    assert fleet_summary(live) == "26 instances: 20 running; 6 exited"
