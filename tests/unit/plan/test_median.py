"""Several profiles as one: every number the median of the profiles', key by key, and profiles of
different models refused with the file named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shoal.errors import ConfigError
from shoal.plan.costs import Link
from shoal.plan.median import median_profile
from shoal.plan.profile import Compute, Network, Profile


def profile(scale: float, *, loop: dict | None = None, points=((4096, 2e-4), (65536, 8e-4)), pace=1.0) -> Profile:
    compute = Compute(model="abc", parameters=10, threads=1, step_seconds={128: 0.001 * scale, 1024: 0.004 * scale},
                      update_seconds=1e-4 * scale, copy_seconds_per_byte=1e-10, evaluate_seconds_per_row=1e-6,
                      load_rows_per_second=1e5 / scale, startup_seconds=5.0 * scale, step_spread=1e-5,
                      loop_factors=loop if loop is not None else {128: scale}, resume_seconds={0.004: 1e-4 * scale})
    across = Link(1e-4 * scale, 1.25e8 / scale, points=tuple((size, seconds * scale) for size, seconds in points))
    network = Network(across=across, inside=Link(3e-5, 2e9), source="measured between a and b", slowest_host=pace)
    return Profile(machine={"host": f"h{scale}"}, compute=compute, network=network)


def paths(*profiles: Profile) -> list[tuple[Path, Profile]]:
    return [(Path(f"p{number}.json"), found) for number, found in enumerate(profiles)]


def test_one_profile_is_itself():
    only = profile(1.0)
    assert median_profile(paths(only)) is only


def test_every_number_is_the_median_of_three_so_one_outlier_moves_nothing():
    merged = median_profile(paths(profile(1.0, pace=1.0), profile(1.6, pace=1.33), profile(0.9, pace=1.05)))
    compute, network = merged.compute, merged.network
    assert compute.step_seconds == {128: pytest.approx(0.001), 1024: pytest.approx(0.004)}
    assert compute.loop_factors == {128: 1.0}
    assert compute.resume_seconds == {0.004: pytest.approx(1e-4)}
    assert (compute.startup_seconds, compute.load_rows_per_second) == (pytest.approx(5.0), pytest.approx(1e5))
    assert (compute.model, compute.parameters, compute.threads) == ("abc", 10, 1)
    assert network.across.latency == pytest.approx(1e-4) and network.across.bandwidth == pytest.approx(1.25e8)
    assert network.across.points == ((4096, pytest.approx(2e-4)), (65536, pytest.approx(8e-4)))
    assert network.slowest_host == 1.05
    assert network.source == "median of 3 profiles, measured between a and b"
    assert merged.machine == {"host": "h1.0"}  # the first profile's


def test_a_key_some_profiles_lack_is_the_median_of_those_that_have_it():
    merged = median_profile(paths(profile(1.0, loop={128: 1.0}), profile(1.0, loop={128: 1.2, 1024: 1.1}),
                                  profile(1.0, loop={128: 0.8, 1024: 1.3}, points=((4096, 4e-4),))))
    assert merged.compute.loop_factors == {128: 1.0, 1024: pytest.approx(1.2)}
    assert merged.network.across.points == ((4096, 2e-4), (65536, 8e-4))  # 4096: median of 2e-4, 2e-4, 4e-4


def test_two_profiles_are_averaged_and_a_missing_section_is_taken_from_the_others():
    without_network = dataclasses.replace(profile(2.0), network=None)
    merged = median_profile(paths(profile(1.0), without_network))
    assert merged.compute.startup_seconds == pytest.approx(7.5)
    assert merged.network.across.latency == pytest.approx(1e-4)


def test_profiles_of_different_models_are_refused_naming_the_file():
    other = profile(1.0)
    other.compute = dataclasses.replace(other.compute, model="xyz")
    with pytest.raises(ConfigError, match=r"^p1.json: compute.model: 'xyz' where p0.json has 'abc'"):
        median_profile(paths(profile(1.0), other))


def test_a_step_and_its_loop_factor_are_kept_together_the_real_step_is_their_products_median():
    """A factor is the real loop over the probe timed beside it: a profile whose probe read slow and whose
    factor read low measured one real step, and its halves must not meet other profiles' halves."""
    computes = [(0.695e-3, 1.07), (0.840e-3, 0.90), (0.713e-3, 0.61)]  # a 2-core VM's three calibrations
    found = [dataclasses.replace(profile(1.0), compute=dataclasses.replace(
        profile(1.0).compute, step_seconds={128: step, 1024: 4 * step}, loop_factors={128: factor}))
        for step, factor in computes]
    merged = median_profile(paths(*found)).compute
    assert merged.loop_factors == {128: pytest.approx(0.90)}
    assert merged.step(128) == pytest.approx(0.695e-3 * 1.07)  # apart, 0.713 x 0.90 = 0.642
    assert merged.step(1024) == pytest.approx(4 * 0.695e-3 * 1.07)  # the factor at 128 holds beyond it


def test_the_pace_range_is_how_far_the_profiles_real_steps_lie_apart_or_the_widest_of_their_own():
    """Real steps at batch 128 (the only batch all three ran the loop at): 1.0 x 1.0, 1.6 x 1.6 and 0.9 x 0.9 ms."""
    slow, steady = profile(1.6), profile(0.9, loop={128: 0.9, 1024: 1.0})
    merged = median_profile(paths(profile(1.0), slow, steady)).compute
    assert merged.pace_range == pytest.approx(1.6 * 1.6 / (0.9 * 0.9))
    own = dataclasses.replace(slow.compute, pace_range=4.0)
    assert median_profile(paths(profile(1.0), dataclasses.replace(slow, compute=own))).compute.pace_range == 4.0
    described = dataclasses.replace(steady.compute, loop_factors={})  # no real loop: only the own ranges count
    assert median_profile(paths(profile(1.0), dataclasses.replace(steady, compute=described))).compute.pace_range == 1.0
