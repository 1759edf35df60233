"""--calibrate's copies at once: how many processes copy memory at full speed together on this host (one and
two processes; a few seconds)."""

from distflow.plan.simulate.calibrate import measure_copies_at_once
from distflow.plan.simulate.hardware_profile import load_profile
from distflow.plan.simulate.step import copies_at_once


def test_one_process_copies_as_fast_as_alone_and_two_no_faster_than_two():
    # one process: its rounds "at once" are rounds alone (a ratio of 1, timing noise aside)
    assert 0.7 < measure_copies_at_once(1, nbytes=16 * 2**20) < 1.4
    # two processes on this 2-core host: at most twice one (1.3-1.6 here: they share the memory bandwidth)
    assert 0.9 < measure_copies_at_once(2, nbytes=16 * 2**20) < 2.3


def test_a_profile_without_the_measurement_copies_on_every_core():
    h100 = load_profile("h100")
    assert copies_at_once(h100) == h100.cores.value
