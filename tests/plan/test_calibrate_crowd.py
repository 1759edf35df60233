"""--calibrate's crowd measurement: collectives of N gloo processes on this host, timed as a round's first
phase (from a barrier) and, for the resharder's exchange and a closing barrier, inside a chain (from the
last rank's arrival) (2 processes; a few seconds)."""

from distflow.plan.simulate.calibrate import measure_gloo_crowd


def test_a_crowd_reports_each_collective_from_a_barrier_and_inside_a_chain():
    crowd = measure_gloo_crowd(ranks=(2,))["2"]
    names = ("allgather_s", "allgather_object_s", "allgather_object_chained_s", "barrier_s", "gather_s")
    for name in names + ("barrier_chained_s",):
        assert crowd[name] >= 0.0, name
    # an all_gather_object is two all-gathers (sizes, then the pickled bytes): more than one barrier
    assert crowd["allgather_object_s"] > crowd["barrier_s"]
    assert crowd["both_ways"] > 0.0
