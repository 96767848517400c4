"""`shoal plan` from the command line, on a profile the test writes (the probes run in tests/cluster)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shoal.api import resolve_job
from shoal.cli import main
from shoal.plan.calibrate import described_network, model_key_of
from shoal.plan.costs import Link
from shoal.plan.planner import job_shape
from shoal.plan.predict import Layout, predict
from shoal.plan.profile import Compute, Network, Profile, load_profile
from tests.e2e.jobs import write_task


@pytest.fixture
def planned(tmp_path):
    """A job with a test set, and a profile of this job's model."""
    train, test = write_task(tmp_path / "task", rows=20_000, test_rows=2000)
    job_path = tmp_path / "job.toml"
    job_path.write_text(f"""
[model]
layers = [{{ dense = 32, activation = "relu" }}, {{ dense = 2 }}]
[data]
train = "{train}"
test = "{test}"
[algorithm]
name = "averaging"
[train]
epochs = 4
batch_size = 64
[cluster]
threads = 1
""")
    job = resolve_job(job_path, [])
    compute = Compute(model=model_key_of(job), parameters=0, threads=1, step_seconds={64: 0.002, 256: 0.006},
                      update_seconds=1e-4, copy_seconds_per_byte=1e-10, evaluate_seconds_per_row=1e-6,
                      load_rows_per_second=2e5, startup_seconds=4.0, step_spread=2e-5)
    profile = Profile(machine={"host": "test"}, compute=compute,
                      network=Network(across=Link(5e-4, 1.25e7), inside=Link(3e-5, 2e9, points=((4096, 5e-5),)),
                                      source="test"))  # loopback measured: workers sharing a machine need it
    profile.save(tmp_path / "profile.json")
    return job_path, tmp_path / "profile.json", profile


def test_plan_prints_a_table_crossovers_and_a_recommendation(planned, capsys, tmp_path):
    job_path, profile_path, _ = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--nodes", "1,2,4",
                 "--plot", str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert "nodes  workers  algorithm" in out
    for algorithm in ("averaging", "sync", "downpour"):
        assert algorithm in out
    assert "against one machine (the fastest job there: " in out
    assert "recommended: " in out
    assert "unsteady" not in out  # the profile's machine held its pace
    assert (tmp_path / "plan.png").stat().st_size > 10_000


def test_plan_json_holds_the_models_predictions(planned, capsys):
    job_path, profile_path, profile = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--nodes", "1,2", "--rows", "500000",
                 "--algorithms", "sync", "--workers-per-node", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    shape = job_shape(resolve_job(job_path, []), 500_000, "sync")
    expected = predict(shape, Layout(2, 2), profile.compute, profile.network)
    row = next(p for p in plan["predictions"] if p["nodes"] == 2)
    assert row["workers"] == 4 and row["rows"] == 500_000
    assert row["epoch_seconds"] == pytest.approx(expected.epoch_seconds)
    assert row["speedup"] == pytest.approx(plan["predictions"][0]["job_seconds"] / expected.job_seconds)
    assert set(plan["crossovers"]) == {"sync"}


def test_a_described_link_replaces_the_profiles(planned, capsys):
    job_path, profile_path, _ = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--link", "10mbit", "--latency", "1ms",
                 "--nodes", "2", "--algorithms", "sync", "--json"]) == 0
    slow = json.loads(capsys.readouterr().out)["predictions"][0]
    assert main(["plan", str(job_path), "--profile", str(profile_path), "--nodes", "2", "--algorithms", "sync",
                 "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["predictions"][0]
    assert slow["communication_seconds"] > measured["communication_seconds"]


def test_a_described_rate_keeps_the_probed_latency_and_says_so(planned, capsys, tmp_path):
    job_path, _, profile = planned
    probed = Link(2e-3, 5e7, points=((2048, 2.04e-3), (65536, 3.3e-3)))
    saved = tmp_path / "probed.json"
    dataclasses.replace(profile, network=dataclasses.replace(profile.network, across=probed)).save(saved)
    assert main(["plan", str(job_path), "--profile", str(saved), "--link", "100mbit", "--nodes", "1,2"]) == 0
    assert "network: described: 100mbit, 2 ms per message as probed; " in capsys.readouterr().out
    assert main(["plan", str(job_path), "--link", "100mbit", "--nodes", "1,2", "--profile", str(saved),
                 "--latency", "0.5ms"]) == 0
    assert "100mbit, 0.5 ms per message given" in capsys.readouterr().out


@pytest.mark.parametrize("arguments, message", [
    (["--nodes", "0,2"], "--nodes: node counts must be >= 1"),
    (["--nodes", "two"], "--nodes: expected node counts"),
    (["--latency", "1ms"], "--latency: only with --link"),
    (["--link", "fast"], "--link: cannot read 'fast'"),
    (["--algorithms", "hogwild"], "--algorithms: unknown algorithm 'hogwild'"),
    (["--workers-per-node", "0"], "--workers-per-node: must be >= 1"),
    (["--rows", "0"], "--rows: must be >= 1"),
    (["--save-profile", "/nonexistent/folder/p.json"], "--save-profile: no folder /nonexistent/folder"),
    (["--plot", "/nonexistent/folder/p.png"], "--plot: no folder /nonexistent/folder"),
])
def test_bad_options_are_one_line_and_exit_2(planned, capsys, arguments, message):
    job_path, profile_path, _ = planned
    assert main(["plan", str(job_path), "--profile", str(profile_path), *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_a_bad_profile_is_one_line_and_exit_2(planned, capsys, tmp_path):
    job_path, _, _ = planned
    (tmp_path / "bad.json").write_text("[]")
    assert main(["plan", str(job_path), "--profile", str(tmp_path / "bad.json")]) == 2
    assert "bad.json: format" in capsys.readouterr().err


def test_a_measured_profile_gains_the_loop_factor_at_a_new_batch_size(planned, capsys, tmp_path, monkeypatch):
    """The real loop is timed again only at a batch size the profile has no factor for (here a stand-in for
    the short real job, whose own run is tests/cluster/test_plan.py's); a described profile is kept as it is."""
    from shoal.plan import compute_probe

    job_path, profile_path, profile = planned
    timed_batches = []

    def real_loop(job, threads, steps):
        timed_batches.append(job.train.batch_size)
        return 4.0, 0.0025  # start-up, and one real step at batch 64 (probed: 0.002)

    monkeypatch.setattr(compute_probe, "measure_loop", real_loop)
    monkeypatch.setattr(compute_probe.ComputeProbe, "step", lambda probe, batch: [0.002])  # as the profile has
    measured = dataclasses.replace(profile.compute, loop_factors={256: 1.1})
    Profile(machine=profile.machine, compute=measured, network=profile.network).save(profile_path)
    saved = tmp_path / "grown.json"
    for _ in range(2):  # the second plan finds batch 64 in the profile it saved
        assert main(["plan", str(job_path), "--profile", str(saved if saved.exists() else profile_path),
                     "--save-profile", str(saved), "--nodes", "1", "--json"]) == 0
    assert timed_batches == [64]
    assert load_profile(saved).compute.loop_factors == {256: 1.1, 64: pytest.approx(1.25)}
    described = tmp_path / "described.json"
    profile.save(described)  # no loop factors: taken as given
    assert main(["plan", str(job_path), "--profile", str(described), "--nodes", "1", "--json"]) == 0
    assert timed_batches == [64]
    capsys.readouterr()


def test_a_plan_says_how_far_the_machines_pace_moved_while_it_was_measured(planned, capsys, tmp_path, monkeypatch):
    """The job's step timed around the real loop (2 and 3 ms) and in the probe's rounds (2, 2.5 and 2 ms): the
    plan warns that a step took up to 1.5x its fastest time, and its JSON carries the range."""
    from shoal.plan import compute_probe

    job_path, _, _ = planned
    timings = iter([0.002, 0.003, 0.002, 0.0025, 0.002])
    monkeypatch.setattr(compute_probe, "measure_loop", lambda job, threads, steps: (4.0, 0.0025))
    monkeypatch.setattr(compute_probe.ComputeProbe, "step",
                        lambda probe, batch: [next(timings) if batch == 64 else 0.002 * batch / 64])
    monkeypatch.setattr(compute_probe.ComputeProbe, "resume", lambda probe, batch: {})
    saved = tmp_path / "measured.json"
    assert main(["plan", str(job_path), "--link", "1gbit", "--nodes", "1,2", "--save-profile", str(saved)]) == 0
    assert "unsteady: a step took up to 1.50x its fastest time while this machine was measured" in (
        capsys.readouterr().out)
    assert load_profile(saved).compute.pace_range == pytest.approx(1.5)
    assert main(["plan", str(job_path), "--profile", str(saved), "--nodes", "1,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pace_range"] == pytest.approx(1.5)


def test_repeated_profiles_plan_from_their_median(planned, capsys, tmp_path):
    """Three calibrations, one taken in a slow moment: the plan is the middle one's, as if that were the only one."""
    job_path, profile_path, profile = planned
    slow = dataclasses.replace(profile.compute, step_seconds={64: 0.006, 256: 0.018}, startup_seconds=9.0)
    fast = dataclasses.replace(profile.compute, step_seconds={64: 0.0019, 256: 0.0055}, startup_seconds=3.9)
    for name, compute in (("slow", slow), ("fast", fast)):
        Profile(machine=profile.machine, compute=compute, network=profile.network).save(tmp_path / f"{name}.json")
    plans = []
    for profiles in ([profile_path], [tmp_path / "slow.json", profile_path, tmp_path / "fast.json"]):
        options = [part for path in profiles for part in ("--profile", str(path))]
        assert main(["plan", str(job_path), *options, "--nodes", "1,2", "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out)["predictions"])
    assert plans[0] == plans[1]


def test_the_networks_messages_are_measured_only_for_a_parameter_server(planned, capsys, tmp_path, monkeypatch):
    """A plan of collective algorithms alone measures all-reduces only (on a 10 Mbit/s link half the probe's
    time); a later plan with a server measures the network again, messages too, rather than price its
    messages on the ring's link. A described network is taken as given. (The probe itself: test_network_probe.)"""
    from shoal.plan import calibrate

    job_path, profile_path, profile = planned
    asked = []
    ring = Link(5e-4, 1.25e7, points=((2048, 6e-4), (65536, 5e-3)))

    def measure_network(hosts, template, port, message, messages=True):
        asked.append((hosts, messages))
        return Network(across=ring, inside=Link(3e-5, 2e9), source="measured between a and b",
                       message_across=Link(1e-4, 1.2e7, points=((4096, 4e-4),)) if messages else None)

    monkeypatch.setattr(calibrate, "measure_network", measure_network)
    collective, served = tmp_path / "collective.json", tmp_path / "served.json"
    Profile(machine=profile.machine, compute=profile.compute).save(collective)
    plan = ["plan", str(job_path), "--hosts", "a,b", "--json"]
    assert main([*plan, "--algorithms", "sync,averaging", "--profile", str(collective),
                 "--save-profile", str(collective)]) == 0
    assert asked == [(["a", "b"], False)]
    assert load_profile(collective).network.message_across is None
    assert main([*plan, "--algorithms", "sync", "--profile", str(collective)]) == 0
    assert len(asked) == 1  # what collectives need is there
    assert main([*plan, "--algorithms", "downpour", "--profile", str(collective), "--save-profile", str(served)]) == 0
    assert asked[1:] == [(["a", "b"], True)]
    assert load_profile(served).network.message_across.points == ((4096, 4e-4),)
    assert main([*plan, "--algorithms", "downpour", "--profile", str(served)]) == 0
    assert main(["plan", str(job_path), "--algorithms", "downpour", "--profile", str(collective), "--json"]) == 0
    assert main([*plan, "--algorithms", "downpour", "--profile", str(profile_path)]) == 0  # described
    assert len(asked) == 2
    capsys.readouterr()


def test_workers_sharing_a_machine_have_its_loopback_measured(planned, capsys, tmp_path, monkeypatch):
    """Several workers per machine: loopback is measured, not assumed (on this machine without --hosts, on the
    first host with them) and saved with the profile; one worker per machine never measures it."""
    from shoal.plan import calibrate

    job_path, _, profile = planned
    asked = []

    def measured_pair(first, second, template, port, sizes, messages=True):
        asked.append((first, second, template, messages))
        return {"loaded_all_reduce": {size: 1e-3 + size / 1e8 for size in sizes}, "pace": 1.0}

    monkeypatch.setattr(calibrate, "measured_pair", measured_pair)
    assumed, measured = tmp_path / "assumed.json", tmp_path / "measured.json"
    Profile(machine=profile.machine, compute=profile.compute,
            network=described_network("1gbit", "0.1ms")).save(assumed)
    plan = ["plan", str(job_path), "--nodes", "1", "--algorithms", "sync", "--json"]
    assert main([*plan, "--profile", str(assumed)]) == 0
    assert asked == []
    single = json.loads(capsys.readouterr().out)["predictions"][0]
    assert single["communication_seconds"] == 0
    assert main([*plan, "--profile", str(assumed), "--workers-per-node", "2", "--save-profile", str(measured)]) == 0
    assert asked == [("127.0.0.1", "127.0.0.1", None, False)]
    shared = json.loads(capsys.readouterr().out)["predictions"][0]
    inside = load_profile(measured).network.inside
    assert inside.points and inside.latency > 3e-4  # the stand-in's 1 ms an all-reduce, not loopback's 30 µs
    assumed_costs = predict(job_shape(resolve_job(job_path, []), None, "sync"), Layout(1, 2), profile.compute,
                            described_network("1gbit", "0.1ms"))
    assert shared["communication_seconds"] > 5 * assumed_costs.communication_seconds
    assert main(["plan", str(job_path), "--nodes", "1", "--algorithms", "sync", "--profile", str(measured),
                 "--workers-per-node", "2"]) == 0
    assert len(asked) == 1  # reused from the profile
    assert "loopback: measured: " in capsys.readouterr().out
    assert main(["plan", str(job_path), "--algorithms", "sync", "--profile", str(assumed), "--workers-per-node", "2",
                 "--hosts", "node7"]) == 0
    assert asked[1][:2] == ("node7", "node7") and asked[1][2] is not None  # through the cluster's remote command


def test_a_training_set_smaller_than_every_batch_is_probed_at_its_rows(tmp_path, capsys, monkeypatch):
    """10 rows and batch 64: the job's steps take all 10 rows, and so does the probe's one step, at batch 64 (the
    ladder's smallest is 16)."""
    from shoal.plan import compute_probe

    train, _ = write_task(tmp_path / "task", rows=10, test_rows=10)
    job_path = tmp_path / "job.toml"
    job_path.write_text(f'[model]\nlayers = [{{ dense = 2 }}]\n[data]\ntrain = "{train}"\n[train]\nbatch_size = 64\n')
    monkeypatch.setattr(compute_probe, "measure_loop", lambda job, threads, steps: (4.0, 0.001))
    monkeypatch.setattr(compute_probe.ComputeProbe, "resume", lambda probe, batch: {})
    saved = tmp_path / "measured.json"
    assert main(["plan", str(job_path), "--link", "1gbit", "--nodes", "1", "--save-profile", str(saved)]) == 0
    assert list(load_profile(saved).compute.step_seconds) == [64]
    assert "recommended: one machine: 1 node(s)" in capsys.readouterr().out
