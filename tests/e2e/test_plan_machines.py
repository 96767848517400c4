"""`shoal plan --machines` from the command line: machines of different speeds given as numbers or as profiles
saved on them, on a profile the test writes (no probe runs)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shoal.api import resolve_job
from shoal.cli import main
from shoal.plan.planner import job_shape
from shoal.plan.predict import Layout, predict
from shoal.plan.profile import Profile
from tests.e2e.test_plan import planned  # noqa: F401 (a fixture)


def predictions(capsys) -> dict:
    return {(p["nodes"], p["balance"]): p for p in json.loads(capsys.readouterr().out)["predictions"]}


def test_machines_of_given_speeds_are_planned_with_equal_and_speed_shares(planned, capsys):  # noqa: F811
    job_path, profile_path, profile = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--machines", "2x1.0,1x0.5",
                 "--algorithms", "sync", "--json"]) == 0
    found = predictions(capsys)
    assert sorted(found) == [(nodes, balance) for nodes in (1, 2, 3) for balance in ("equal", "speed")]
    shape = job_shape(resolve_job(job_path, []), None, "sync")
    for balance in ("equal", "speed"):
        expected = predict(dataclasses.replace(shape, balance=balance), Layout(3, 1, (1.0, 1.0, 0.5)),
                           profile.compute, profile.network)
        assert found[(3, balance)]["epoch_seconds"] == pytest.approx(expected.epoch_seconds)
    assert found[(3, "speed")]["compute_seconds"] < found[(3, "equal")]["compute_seconds"]
    assert found[(2, "speed")]["epoch_seconds"] == pytest.approx(found[(2, "equal")]["epoch_seconds"])

    assert main(["plan", str(job_path), "--profile", str(profile_path), "--machines", "2x1.0,1x0.5",
                 "--algorithms", "sync"]) == 0
    out = capsys.readouterr().out
    assert "machines: 2 x 1.00, 1 x 0.50" in out and "nodes  workers  algorithm  shares" in out
    # from the profile the fixture wrote (no probe ran): the same sentence on any machine, however loaded
    assert "  sync, speed shares: faster than one machine from 2 machines on (" in out


def test_a_profile_saved_on_a_slower_machine_gives_its_speed(planned, capsys, tmp_path):  # noqa: F811
    job_path, profile_path, profile = planned
    slow = dataclasses.replace(profile.compute, step_seconds={batch: seconds * 2 for batch, seconds in
                                                              profile.compute.step_seconds.items()})
    Profile(machine={"host": "slow"}, compute=slow, network=profile.network).save(tmp_path / "slow.json")
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--machines", "2x1.0,1x0.5",
                 "--algorithms", "averaging", "--json"]) == 0
    given = predictions(capsys)
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--machines",
                 f"2x{profile_path},1x{tmp_path / 'slow.json'}", "--algorithms", "averaging", "--json"]) == 0
    measured = predictions(capsys)
    assert measured.keys() == given.keys()
    for key, prediction in given.items():
        assert measured[key]["epoch_seconds"] == pytest.approx(prediction["epoch_seconds"])


@pytest.mark.parametrize("arguments, message", [
    (["--machines", "2x1.0,1x0.5", "--nodes", "2,4"], "--nodes: 4 nodes, but --machines lists 3"),
    (["--machines", "2x1.0", "--hosts", "a,b,c"], "--machines: lists 2 machine(s) for 3 --hosts"),
    (["--machines", "2x1.0,fast"], "--machines: expected COUNTxSPEED or COUNTxPROFILE"),
    (["--machines", "2x0"], "--machines: '2x0': a speed must be a number > 0"),
])
def test_bad_machines_are_one_line_and_exit_2(planned, capsys, arguments, message):  # noqa: F811
    job_path, profile_path, _ = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_a_profile_of_another_model_is_refused(planned, capsys, tmp_path):  # noqa: F811
    job_path, profile_path, profile = planned
    other = dataclasses.replace(profile.compute, model="another model")
    Profile(compute=other, network=profile.network).save(tmp_path / "other.json")
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--machines",
                 f"1x1.0,1x{tmp_path / 'other.json'}"]) == 2
    assert "other.json: compute.model: measured on another model" in capsys.readouterr().err
