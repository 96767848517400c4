"""Profiles: saved whole, read back equal, and a bad one is one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shoal.errors import ConfigError
from shoal.plan.calibrate import parse_latency, parse_rate
from shoal.plan.costs import Link
from shoal.plan.profile import Compute, Network, Profile, load_profile


def profile() -> Profile:
    compute = Compute(model="abc", parameters=10, threads=1, step_seconds={32: 0.001, 128: 0.003},
                      update_seconds=1e-4, copy_seconds_per_byte=1e-10, evaluate_seconds_per_row=1e-6,
                      load_rows_per_second=1e5, startup_seconds=5.0, step_spread=1e-5,
                      loop_factors={128: 0.9, 1024: 1.2}, resume_seconds={0.001: 1e-5, 0.016: 1e-4, 0.256: 5e-4},
                      pace_range=1.3)
    network = Network(across=Link(1e-4, 1.25e8, points=((4096, 2e-4), (65536, 8e-4))), inside=Link(3e-5, 2e9),
                      source="described")
    return Profile(machine={"host": "h"}, compute=compute, network=network)


def test_a_saved_profile_reads_back_equal(tmp_path):
    path = tmp_path / "profile.json"
    profile().save(path)
    assert load_profile(path) == profile()
    assert not list(tmp_path.glob(".*"))  # no temporary left beside it


def test_a_profile_saved_before_the_pace_range_reads_as_a_steady_machine(tmp_path):
    raw = json.loads(profile().to_json())
    del raw["compute"]["pace_range"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    assert load_profile(path).compute.pace_range == 1.0


def test_a_profile_saved_before_latency_and_rate_were_priced_apart_is_priced_as_it_was(tmp_path):
    """Format 2 priced a measured link through its points: read, it still is, and the plan says so; saved again
    it stays so. A new profile prices its measured links by their line."""
    from shoal.plan.planner import make_plan
    from shoal.plan.predict import Shape
    from shoal.plan.render import render

    raw = json.loads(profile().to_json())
    raw["format"] = 2
    for link in raw["network"].values():
        if isinstance(link, dict):
            del link["interpolated"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    read = load_profile(old)
    across = read.network.across
    assert across.interpolated and not read.network.inside.interpolated  # loopback had no points
    assert across.seconds(4096) == pytest.approx(2e-4) and across.seconds(35_000) == pytest.approx(5e-4, rel=0.01)
    read.save(tmp_path / "again.json")
    assert load_profile(tmp_path / "again.json").network.across.interpolated
    fresh = load_profile(_saved(tmp_path, profile()))
    assert not fresh.network.across.interpolated
    assert fresh.network.across.seconds(4096) == pytest.approx(1e-4 + 4096 / 1.25e8)
    shape = Shape(parameters=10, buffers=0, rows=1000, test_rows=0, batch=32, epochs=1, eval_every=1,
                  algorithm="sync", options={})
    assert "note: a profile of format 2" in render(make_plan([shape], [1, 2], 1, read), read, 1)
    assert "note:" not in render(make_plan([shape], [1, 2], 1, fresh), fresh, 1)


def _saved(folder, found: Profile):
    found.save(folder / "new.json")
    return folder / "new.json"


def test_steps_are_interpolated_between_measured_batches_and_extended_beyond():
    compute = dataclasses.replace(profile().compute, loop_factors={})
    assert compute.step(64) == pytest.approx(0.001 + 32 * (0.002 / 96))
    assert compute.step(256) == pytest.approx(0.003 + 128 * (0.002 / 96))


def test_the_loop_factor_is_the_one_measured_at_a_batch_and_interpolated_in_log_batch_between():
    compute = profile().compute
    assert compute.loop_factor(128) == 0.9 and compute.loop_factor(1024) == 1.2
    assert compute.loop_factor(16) == 0.9 and compute.loop_factor(4096) == 1.2  # the nearest beyond
    assert compute.loop_factor(512) == pytest.approx(0.9 + (2 / 3) * 0.3)  # two of three doublings
    assert compute.step(128) == pytest.approx(0.003 * 0.9)
    assert dataclasses.replace(compute, loop_factors={}).loop_factor(128) == 1.0


def test_the_cost_of_resuming_rises_with_the_wait_and_stops_at_the_longest_measured():
    compute = profile().compute
    assert compute.resume(0.016) == 1e-4
    assert compute.resume(0.0005) == pytest.approx(0.5e-5)  # in proportion below the shortest wait
    assert compute.resume(0.004) == pytest.approx(1e-5 + 0.5 * 9e-5)  # half way in log wait
    assert compute.resume(10.0) == 5e-4 and compute.resume(0) == 0.0
    assert dataclasses.replace(compute, resume_seconds={}).resume(0.1) == 0.0


@pytest.mark.parametrize("change, key", [
    (lambda raw: raw["compute"].update(resume_seconds={"soon": 1.0}), "compute.resume_seconds: each seconds idle"),
    (lambda raw: raw["compute"].update(resume_seconds={"-1": 1.0}), "compute.resume_seconds: each seconds idle"),
    (lambda raw: raw["compute"].update(resume_seconds={"0.1": -1.0}), "compute.resume_seconds.0.1"),
    (lambda raw: raw.update(format=7), "format"),
    (lambda raw: raw.update(format=1), "format: expected 3 \\(or 2\\), got 1"),
    (lambda raw: raw["compute"].update(loop_factors=[1.0]), "compute.loop_factors"),
    (lambda raw: raw["compute"].update(loop_factors={"128": 0}), "compute.loop_factors.128"),
    (lambda raw: raw["compute"].update(update_seconds=-1), "compute.update_seconds"),
    (lambda raw: raw["compute"].update(pace_range=0.5), "compute.pace_range: expected a number >= 1.0"),
    (lambda raw: raw["compute"].update(step_seconds={}), "compute.step_seconds"),
    (lambda raw: raw["compute"].update(step_seconds={"big": 1.0}), "compute.step_seconds"),
    (lambda raw: raw["network"]["across"].update(bandwidth="fast"), "network.across.bandwidth"),
    (lambda raw: raw["network"]["across"].update(points=[1, 2]), "network.across.points"),
    (lambda raw: raw.update(network=[]), "network"),
])
def test_a_bad_profile_names_the_file_and_key(tmp_path, change, key):
    raw = json.loads(profile().to_json())
    change(raw)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=f"{path}: {key}"):
        load_profile(path)


def test_a_missing_or_unreadable_profile_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such profile"):
        load_profile(tmp_path / "absent.json")
    (tmp_path / "torn.json").write_text('{"format": 2, "comp')
    with pytest.raises(ConfigError, match="torn.json: not a shoal profile"):
        load_profile(tmp_path / "torn.json")


def test_described_links_read_rates_and_times():
    assert parse_rate("1gbit") == 1e9 and parse_rate("100Mbit") == 1e8 and parse_rate("10mbps") == 1e7
    assert parse_latency("0.1ms") == pytest.approx(1e-4) and parse_latency("50us") == pytest.approx(5e-5)
    with pytest.raises(ConfigError, match="--link: cannot read 'fast'"):
        parse_rate("fast")
    with pytest.raises(ConfigError, match="--latency: cannot read"):
        parse_latency("soon")
