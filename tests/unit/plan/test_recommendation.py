"""What `shoal plan` recommends, and what it says in words: nothing while its measurement was unsteady, one
machine unless more are at least 1.2x as fast, and one plain sentence per algorithm against one machine.

Most plans here are made up (predictions with chosen job times), so each rule is checked at its edge."""

from __future__ import annotations

import json

import pytest

from shoal.plan.costs import Line
from shoal.plan.planner import Forecast, counts_text, make_plan, recommend, series_sentence
from shoal.plan.predict import Prediction
from shoal.plan.profile import Profile
from shoal.plan.render import render
from tests.unit.plan.test_predict import NETWORK, compute, shape

PROFILE = Profile(machine={"host": "test"}, compute=compute(), network=NETWORK)
SHAPES = [shape("sync"), shape("averaging"), shape("downpour")]


def made_up(nodes: int, seconds: float, algorithm: str = "sync", line: Line | None = None) -> Prediction:
    """A job of `seconds` on `nodes` machines, all compute (no larger batch is suggested)."""
    return Prediction(algorithm=algorithm, nodes=nodes, workers=nodes, trainers=nodes, rows=10_000, steps=100,
                      epoch_seconds=seconds / 4, compute_seconds=seconds / 4, communication_seconds=0.0,
                      evaluation_seconds=0.0, startup_seconds=0.0, load_seconds=0.0, job_seconds=seconds,
                      bytes_per_epoch=0.0, staleness=None, line=line or Line(0.0, seconds / 10_000))


def plan_of(*predictions: Prediction) -> Forecast:
    return Forecast(list(predictions), one_machine=min((p for p in predictions if p.nodes == 1),
                                                    key=lambda p: p.job_seconds, default=None))


# ---------------------------------------------------------------- (a) an unsteady measurement

def test_an_unsteady_measurement_gets_no_recommendation_but_what_moved_and_how_to_measure_steadily():
    """Steps up to 79x their fastest (a loaded machine): two plans of it must not recommend 16 nodes and then 4."""
    shapes = [shape(name, rows=1_000_000) for name in ("sync", "averaging", "downpour")]
    for steps in ({100: 0.01, 200: 0.02}, {100: 0.03, 200: 0.05}):  # two moments of the same loaded machine
        moving = Profile(machine={"host": "test"}, compute=compute(step_seconds=steps, pace_range=79.0),
                         network=NETWORK)
        plan = make_plan(shapes, [1, 2, 4, 8, 16], 1, moving)
        assert plan.recommendation == "" and plan.compression == ""
        assert plan.withheld.startswith("the measurement moved by 79x between probes"), plan.withheld
        text = render(plan, moving, 1)
        assert "recommended:" not in text and "compression:" not in text
        assert "\nno recommendation: the measurement moved by 79x between probes" in text
        assert "measure again while the machines run nothing else (--save-profile keeps that measurement, " \
               "--profile plans from it)" in text
        assert "unsteady: a step took up to 79.00x its fastest time while this machine was measured; epochs will " \
               "move as much, so no recommendation (below)" in text
        found = json.loads(json.dumps(plan.to_dict()))
        assert found["recommendation"] is None and found["recommendation_withheld"] == plan.withheld
        assert found["pace_range"] == 79.0 and len(found["predictions"]) == 14


def test_a_steady_measurement_is_recommended_as_before():
    """At the edge (a pace range of 1.15) the plan still recommends; its JSON says nothing was withheld."""
    edge = Profile(machine={"host": "test"}, compute=compute(pace_range=1.15), network=NETWORK)
    plan = make_plan([shape("averaging", rows=1_000_000)], [1, 2, 4], 1, edge)
    assert plan.withheld == "" and plan.recommendation.startswith("4 node(s) x 1 worker(s), averaging")
    assert plan.to_dict()["recommendation_withheld"] is None
    assert "recommended: 4 node(s)" in render(plan, edge, 1)


def test_a_plan_of_one_machine_alone_is_told_so_however_unsteady():
    """With no more machines planned there is no choice for the measurement to flip."""
    moving = Profile(machine={"host": "test"}, compute=compute(pace_range=2.0), network=NETWORK)
    plan = make_plan([shape("sync")], [1], 1, moving)
    assert plan.withheld == ""
    assert plan.recommendation.endswith("no layout of more than one machine was planned"), plan.recommendation


# ---------------------------------------------------------------- (b) one sentence per algorithm

@pytest.mark.parametrize("faster, planned, said", [
    ([2, 4, 8, 16], [2, 4, 8, 16], "from 2 machines on"),
    ([4, 8], [2, 4, 8], "from 4 machines on"),
    ([2, 4], [2, 4, 8, 16], "on 2 to 4 machines"),
    ([4], [2, 4, 8], "on 4 machines"),
    ([2, 8, 16], [2, 4, 8, 16], "on 2 machines and from 8 machines on"),
])
def test_the_node_counts_that_beat_one_machine_are_said_as_runs(faster, planned, said):
    assert counts_text(faster, planned) == said


def test_each_algorithm_is_one_sentence_against_one_machine():
    one = made_up(1, 10.0, line=Line(5.0, 5e-4))  # 10 s at the 10,000 rows planned
    assert series_sentence(one, [made_up(2, 8.0), made_up(4, 5.5)]) == \
        "faster than one machine from 2 machines on (1.82x on 4)"
    assert series_sentence(one, [made_up(2, 8.0), made_up(4, 11.0)]) == "faster than one machine on 2 machines (1.25x)"
    # 2 machines: 4.5 s more to start, 0.25 ms a row less: even at 18,000 rows; 4 machines only at 30,000
    two, four = made_up(2, 12.0, line=Line(9.5, 2.5e-4)), made_up(4, 14.0, line=Line(11.0, 3e-4))
    assert series_sentence(one, [two, four]) == \
        "never faster than one machine here (with 2 machines it would be from 18,000 rows)"
    assert series_sentence(one, [made_up(2, 12.0, line=Line(6.0, 6e-4))]) == "never faster than one machine here"
    assert series_sentence(one, [made_up(2, 9.95)]) == "never faster than one machine here"  # 0.5%: no faster
    assert series_sentence(one, []) == "no layout of more than one machine planned"


def test_the_plan_prints_the_sentences_in_place_of_the_crossover_lists():
    shapes = [shape("sync", rows=1_000_000), shape("averaging", rows=1_000_000)]
    plan = make_plan(shapes, [1, 2, 4], 1, PROFILE)
    text = render(plan, PROFILE, 1)
    assert "nodes from" not in text and "always" not in text and "rows from which" not in text
    assert "\nagainst one machine (the fastest job there: sync, " in text
    assert "\n  sync: faster than one machine from 2 machines on (" in text
    assert "\n  averaging: faster than one machine from 2 machines on (" in text
    assert set(plan.to_dict()["crossovers"]) == {"sync", "averaging"}  # still in the JSON


# ---------------------------------------------------------------- (c) at least 1.2x for more machines

def test_more_machines_under_1_2x_faster_than_one_are_not_recommended():
    """4 machines 1.18x as fast as one: once over the old 10% margin, now one machine, saying why."""
    plan = plan_of(made_up(1, 10.0), made_up(2, 8.7), made_up(4, 8.5))
    assert recommend(plan, SHAPES, 1, PROFILE) == (
        "one machine: 1 node(s) x 1 worker(s), sync, batch 100: no layout of more machines is 1.2x as fast (the "
        "fastest, 4 node(s) with sync, takes 8.5 s against 10 s: 1.18x)")


def test_the_cluster_recommended_is_at_least_1_2x_faster_than_one_machine():
    """16 machines 1.30x, 2 machines 1.19x (within a tenth of 16's): the smallest cluster both near the
    fastest and 1.2x as fast as one machine is 4."""
    plan = plan_of(made_up(1, 13.0), made_up(2, 10.9), made_up(4, 10.8), made_up(16, 10.0))
    assert recommend(plan, SHAPES, 1, PROFILE) == (
        "4 node(s) x 1 worker(s), sync, batch 100: 1.2x faster than one machine (10.8 s against 13 s); 16 node(s) "
        "with sync would save only 7% of the job's time")


def test_a_parameter_servers_speed_up_is_against_one_machine_not_its_own_two_nodes():
    """Downpour on 2 nodes (a server and one trainer) takes 20 s, on 16 nodes 4 s, one machine 10 s: 2.5x faster
    than one machine, where against its own 2 nodes it read 5x, said as if against one node."""
    plan = plan_of(made_up(1, 10.0), made_up(2, 20.0, "downpour"), made_up(16, 4.0, "downpour"))
    assert recommend(plan, SHAPES, 1, PROFILE) == (
        "16 node(s) x 1 worker(s), downpour, batch 100: 2.5x faster than one machine (4 s against 10 s)")
    assert plan.speedup(plan.predictions[2]) == pytest.approx(2.5)
    assert plan.speedup(plan.predictions[1]) == pytest.approx(0.5)
    assert plan.efficiency(plan.predictions[2]) == pytest.approx(2.5 / 16)


def test_without_one_machine_the_fewest_machines_planned_are_what_more_must_beat():
    """Downpour alone runs on 2 nodes at the fewest: 4 nodes 1.1x as fast as 2 are not worth booking."""
    plan = plan_of(made_up(2, 11.0, "downpour"), made_up(4, 10.0, "downpour"))
    assert recommend(plan, SHAPES, 1, PROFILE) == (
        "2 node(s) x 1 worker(s), downpour, batch 100: no layout of more machines is 1.2x as fast (the fastest, "
        "4 node(s) with downpour, takes 10 s against 11 s: 1.10x)")
