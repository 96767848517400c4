"""`shoal plan`'s answer: predictions per cluster size and algorithm, crossovers and a recommendation.

The user's first question before booking machines is "how many, which algorithm, how long?".
The planner predicts every (node count, algorithm) pair for the job's model and data, finds for
each node count the smallest dataset at which it beats the count below it (the Parallel SGD
study's crossover, in the JSON), says in one sentence per algorithm from how many machines it
beats one machine (every speed-up is against one machine's fastest job, whatever its algorithm),
and recommends a cluster only where it stands behind it: several machines only when they are at
least 1.2x as fast as one machine on the same rows (the smallest such cluster within a tenth of
the fastest job), else one machine, said plainly with why; and nothing at all while the
measurement was unsteady (its steps' times moved beyond 1.15x) and there was a choice to make,
since a plan is no steadier than the machine it was measured on: two plans of one loaded machine
44 s apart recommended 16 nodes and 4. On machines of different speeds each algorithm is a series
twice over, with equal shares and with speed shares, so the recommendation says which to set. When
exact sync would wait on the link longer than it computes, a second line names the compression that
helps, with the epoch of each beside exact's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

from shoal.config import GROUP_BY_MACHINE, JobConfig
from shoal.plan.costs import crossover
from shoal.plan.predict import Layout, Prediction, Shape, group_count, is_server, name, predict, trainers
from shoal.plan.profile import Profile

COMPARED = ("sync", "averaging", "downpour")
CLOSE_ENOUGH = 1.10  # a cluster within this factor of the fastest job is worth its fewer machines
WORTH_MORE_MACHINES = 1.2  # the least predicted speed-up over one machine that several are recommended for
NOTICEABLE = 1.01  # a speed-up below this is no faster: within the prediction's rounding
UNSTEADY = 1.15  # a pace range beyond which a prediction's compute can be off by more than 15%: no recommendation
COMMUNICATION_BOUND = 0.5  # above this share of the epoch, a larger batch is suggested


def job_shape(job: JobConfig, rows: int | None = None, algorithm: str | None = None) -> Shape:
    """The planner's view of `job` (its training set's rows, or `rows`), optionally under another algorithm."""
    from shoal.data.format import open_dataset
    from shoal.train.prepare import allocate_model, model_spec

    train_set = open_dataset(job.data.train)
    test_rows = open_dataset(job.data.test).rows if job.data.test else 0
    model = allocate_model(model_spec(job, train_set))
    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    name = algorithm or job.algorithm.name
    options = dict(job.algorithm.options) if name == job.algorithm.name else {}
    shapes = tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)
    shape = Shape(parameters=sum(p.numel() for p in model.parameters()), buffers=buffers, parameter_shapes=shapes,
                  rows=rows if rows is not None else train_set.rows, test_rows=test_rows, batch=job.train.batch_size,
                  epochs=job.train.epochs, eval_every=job.train.eval_every, algorithm=name, options=options,
                  groups=job.cluster.groups, accumulate=job.train.accumulate,
                  validation_split=job.train.validation_split)
    if shape.groups == GROUP_BY_MACHINE and is_server(shape):  # a server takes no machine groups: one group
        shape = dataclasses.replace(shape, groups=1)
    return shape


@dataclass
class Forecast:
    """What `shoal plan` answers: every prediction, the crossovers, and the recommendation (or why there is
    none)."""

    predictions: list[Prediction]
    crossovers: dict[str, dict[int, float | None]] = field(default_factory=dict)
    """Series (the algorithm, and how the rows were shared on machines of different speeds) -> node count ->
    the rows from which it beats the node count before it."""
    recommendation: str = ""
    withheld: str = ""
    """Why there is no recommendation (an unsteady measurement), and how to get one; empty when there is one."""
    compression: str = ""
    """When exact sync waits on the link longer than it computes: the compression that helps, and its epoch."""
    baseline: dict[str, float] = field(default_factory=dict)
    """Series -> the job seconds of its smallest cluster."""
    pace_range: float = 1.0
    """How far the machine's pace moved while its compute was measured (slowest over fastest step)."""
    speeds: tuple[float, ...] = ()
    """Each machine's speed against the profile's, in rank order (a plan of N nodes takes the first N); empty
    when every machine is the profile's."""
    one_machine: Prediction | None = None
    """The fastest job on one machine (the first), on the same rows: what several machines must beat."""

    def speedup(self, prediction: Prediction) -> float:
        """Against one machine's fastest job (`job_to_beat`), whatever the algorithm: a series' own smallest
        cluster (a parameter server's 2 nodes) would make a slow start look like a speed-up."""
        return times_faster(job_to_beat(self), prediction)

    def efficiency(self, prediction: Prediction) -> float:
        return self.speedup(prediction) * job_to_beat(self).nodes / prediction.nodes

    def to_dict(self) -> dict:
        return {"predictions": [{**asdict(p), "speedup": self.speedup(p), "communication_share": p.communication_share}
                                for p in self.predictions],
                "crossovers": {name: {str(n): rows for n, rows in found.items()}
                               for name, found in self.crossovers.items()},
                "recommendation": None if self.withheld else self.recommendation,
                "recommendation_withheld": self.withheld or None,
                "compression": self.compression, "pace_range": self.pace_range,
                "machine_speeds": list(self.speeds),
                "one_machine": None if self.one_machine is None else asdict(self.one_machine)}


def usable(shape: Shape, layout: Layout) -> bool:
    """Whether the algorithm can run on this many workers (a server needs a trainer besides itself)."""
    return (trainers(shape, layout) >= max(1, group_count(shape, layout))
            and shape.rows // max(trainers(shape, layout), 1) > 0)


def first_machines(nodes: int, per_node: int, speeds: tuple[float, ...] = ()) -> Layout:
    """The first `nodes` machines, `per_node` workers each, at their speeds when they differ."""
    return Layout(nodes, per_node, tuple(speeds[:nodes]))


def make_plan(shapes: list[Shape], nodes: list[int], per_node: int, profile: Profile,
              speeds: tuple[float, ...] = ()) -> Forecast:
    """Every algorithm on every node count; with `speeds` (one per machine, at least max(nodes) of them), each
    with equal shares and with speed shares."""
    balances = ("equal", "speed") if speeds else ("equal",)
    predictions = [predict(dataclasses.replace(shape, balance=balance), first_machines(count, per_node, speeds),
                           profile.compute, profile.network)
                   for shape in shapes for count in nodes if usable(shape, Layout(count, per_node))
                   for balance in balances]
    plan = Forecast(predictions, pace_range=profile.compute.pace_range, speeds=tuple(speeds),
                one_machine=one_machine(predictions, shapes, per_node, profile, speeds))
    for series in dict.fromkeys(p.label for p in predictions):
        own = [p for p in predictions if p.label == series]
        plan.baseline[series] = own[0].job_seconds
        plan.crossovers[series] = {later.nodes: crossover(earlier.line, later.line)
                                   for earlier, later in zip(own, own[1:])}
    if plan.pace_range > UNSTEADY and chosen_cluster(plan)[1] is not None:  # a choice its own timings could flip
        plan.withheld = unsteady_text(plan.pace_range)
    else:
        plan.recommendation = recommend(plan, shapes, per_node, profile)
        plan.compression = compression_advice(plan, shapes, per_node, profile)
    return plan


def unsteady_text(pace_range: float) -> str:
    """Why an unsteady measurement gets no recommendation, and how to get a steady one."""
    return (f"the measurement moved by {pace_range:.3g}x between probes (its slowest step over its fastest), so "
            "the epochs above may be off by as much. For a steady one, measure again while the "
            "machines run nothing else (--save-profile keeps that measurement, --profile plans from it)")


def one_machine(predictions: list[Prediction], shapes: list[Shape], per_node: int, profile: Profile,
                speeds: tuple[float, ...] = ()) -> Prediction | None:
    """The fastest job on one machine: among the plan's own, else predicted for it (`--nodes` without 1)."""
    own = [p for p in predictions if p.nodes == 1]
    if not own:
        layout = first_machines(1, per_node, speeds)
        own = [predict(shape, layout, profile.compute, profile.network) for shape in shapes if usable(shape, layout)]
    return min(own, key=lambda p: p.job_seconds, default=None)


def job_to_beat(plan: Forecast) -> Prediction:
    """What more machines must beat: the fastest job on one machine; where no algorithm planned runs on one (a
    parameter server alone), the fastest job on the fewest machines planned."""
    if plan.one_machine is not None:
        return plan.one_machine
    fewest = min(p.nodes for p in plan.predictions)
    return min((p for p in plan.predictions if p.nodes == fewest), key=lambda p: p.job_seconds)


def times_faster(slower: Prediction, faster: Prediction) -> float:
    return slower.job_seconds / faster.job_seconds


def machine_count_text(nodes: int) -> str:
    return "one machine" if nodes == 1 else f"{nodes} machines"


def chosen_cluster(plan: Forecast) -> tuple[Prediction | None, Prediction | None]:
    """(the cluster recommended, the fastest job): the smallest cluster within CLOSE_ENOUGH of the fastest job
    among those at least WORTH_MORE_MACHINES times as fast as `job_to_beat`; (None, the fastest of more
    machines) when none is, or (None, None) when no more machines were planned."""
    start = job_to_beat(plan)
    more = [p for p in plan.predictions if p.nodes > start.nodes]
    fastest = min(more, key=lambda p: p.job_seconds, default=None)
    if fastest is None or times_faster(start, fastest) < WORTH_MORE_MACHINES:
        return None, fastest
    worth = [p for p in more if times_faster(start, p) >= WORTH_MORE_MACHINES]
    chosen = min((p for p in worth if p.job_seconds <= fastest.job_seconds * CLOSE_ENOUGH),
                 key=lambda p: (p.nodes, p.job_seconds))
    return chosen, fastest


def recommend(plan: Forecast, shapes: list[Shape], per_node: int, profile: Profile) -> str:
    """The cluster `chosen_cluster` picks and its speed-up over one machine (or the fewest machines planned); else
    one machine (or the fewest), saying why more would not pay; with a batch size."""
    start = job_to_beat(plan)
    chosen, fastest = chosen_cluster(plan)
    if chosen is None:
        prefix = "one machine: " if start.nodes == 1 else ""
        return prefix + cluster_text(start, staying_reason(start, fastest), shapes, per_node, plan, profile)
    reason = (f"{times_faster(start, chosen):.1f}x faster than {machine_count_text(start.nodes)} ({job_text(chosen)} "
              f"against {job_text(start)})")
    if chosen is not fastest:
        reason += (f"; {fastest.nodes} node(s) with {shares_text(fastest)} would save only "
                   f"{1 - fastest.job_seconds / chosen.job_seconds:.0%} of the job's time")
    return cluster_text(chosen, reason, shapes, per_node, plan, profile)


def staying_reason(start: Prediction, fastest: Prediction | None) -> str:
    """Why no more machines than `start`'s: none planned, or the fastest of them under WORTH_MORE_MACHINES."""
    if fastest is None:
        return f"no layout of more than {machine_count_text(start.nodes)} was planned"
    return (f"no layout of more machines is {WORTH_MORE_MACHINES:.1f}x as fast (the fastest, {fastest.nodes} "
            f"node(s) with {shares_text(fastest)}, takes {job_text(fastest)} against {job_text(start)}: "
            f"{times_faster(start, fastest):.2f}x)")


def against_one_machine(plan: Forecast) -> dict[str, str]:
    """Series -> one plain sentence: on which node counts it beats `job_to_beat` (one machine), by how much at
    best; where it never does, from how many rows it would."""
    start = job_to_beat(plan)
    return {series: series_sentence(start, [p for p in plan.predictions if p.label == series and p.nodes > start.nodes])
            for series in dict.fromkeys(p.label for p in plan.predictions)}


def series_sentence(start: Prediction, own: list[Prediction]) -> str:
    """`faster than one machine from 2 machines on (1.80x on 4)`, or `never faster than one machine here`."""
    beaten = machine_count_text(start.nodes)
    if not own:
        return f"no layout of more than {beaten} planned"
    faster = [p for p in own if times_faster(start, p) >= NOTICEABLE]
    if not faster:
        return f"never faster than {beaten} here" + more_rows_text(start, own)
    best = max(faster, key=lambda p: times_faster(start, p))
    where = "" if len(faster) == 1 else f" on {best.nodes}"
    return (f"faster than {beaten} {counts_text([p.nodes for p in faster], [p.nodes for p in own])} "
            f"({times_faster(start, best):.2f}x{where})")


def more_rows_text(start: Prediction, own: list[Prediction]) -> str:
    """` (with 2 machines it would be from 61,203 rows)`: the fewest rows beyond the plan's from which a layout of
    `own` beats `start` (their job times' lines cross); empty when none ever does."""
    crossings = [(rows, p.nodes) for p in own
                 if (rows := crossover(start.line, p.line)) is not None and rows > start.rows]
    if not crossings:
        return ""
    rows, nodes = min(crossings)
    return f" (with {nodes} machines it would be from {rows_text(rows)} rows)"


def counts_text(faster: list[int], planned: list[int]) -> str:
    """`from 2 machines on`, `on 2 to 8 machines`, `on 4 machines`: the runs of planned node counts that are faster."""
    runs: list[list[int]] = []
    for previous, count in zip([None, *planned], planned):
        if count in faster:
            if runs and previous in runs[-1]:
                runs[-1].append(count)
            else:
                runs.append([count])
    return " and ".join(f"on {run[0]} machines" if len(run) == 1 else
                        f"from {run[0]} machines on" if run[-1] == planned[-1] else
                        f"on {run[0]} to {run[-1]} machines" for run in runs)


def job_text(prediction: Prediction) -> str:
    return f"{prediction.job_seconds:.3g} s"


def cluster_text(chosen: Prediction, reason: str, shapes: list[Shape], per_node: int, plan: Forecast,
                 profile: Profile) -> str:
    """`N node(s) x W worker(s), algorithm, batch B: reason`, with a larger batch where communication is over
    COMMUNICATION_BOUND of the epoch."""
    shape = dataclasses.replace({name(s): s for s in shapes}[chosen.algorithm], balance=chosen.balance or "equal")
    batch = shape.batch
    if chosen.communication_share > COMMUNICATION_BOUND:
        batch = larger_batch(shape, first_machines(chosen.nodes, per_node, plan.speeds), profile) or batch
        if batch != shape.batch:
            timed = max(profile.compute.step_seconds)
            beyond = f"; its step priced beyond batch {timed}, the largest timed" if batch > timed else ""
            reason += (f"; {chosen.communication_share:.0%} of its epoch is communication, batch {batch} "
                       f"brings it under {COMMUNICATION_BOUND:.0%} (check the accuracy{beyond})")
    return f"{chosen.nodes} node(s) x {per_node} worker(s), {shares_text(chosen)}, batch {batch}: {reason}"


def compression_advice(plan: Forecast, shapes: list[Shape], per_node: int, profile: Profile) -> str:
    """One line when exact sync, on the recommended cluster (or the smallest of several machines), waits on the
    link longer than it computes: bf16's and powersgd's epochs beside exact's, the faster one recommended."""
    sync = next((shape for shape in shapes if shape.algorithm == "sync"), None)
    chosen, _ = chosen_cluster(plan)
    counts = [p.nodes for p in plan.predictions if p.algorithm == "sync" and p.nodes > 1]
    if sync is None or not counts:
        return ""
    nodes = chosen.nodes if chosen is not None and chosen.nodes in counts else min(counts)
    layout = first_machines(nodes, per_node, plan.speeds)
    epochs = {}
    for compression in ("none", "bf16", "powersgd"):
        variant = dataclasses.replace(sync, options={**sync.options, "compression": compression})
        epochs[compression] = predict(variant, layout, profile.compute, profile.network)
    exact = epochs["none"]
    if exact.communication_seconds <= exact.compute_seconds:
        return ""
    best = min(("bf16", "powersgd"), key=lambda name: epochs[name].epoch_seconds)
    if epochs[best].epoch_seconds >= exact.epoch_seconds:  # a latency-bound link: compression would not help
        return ""
    each = ", ".join(f"{name} {seconds(epochs[name])}" for name in ("bf16", "powersgd"))
    return (f"exact sync on {nodes} node(s) waits {exact.communication_seconds:.2f} s an epoch for the link against "
            f'{exact.compute_seconds:.2f} s of compute: algorithm.compression = "{best}" would take '
            f"{seconds(epochs[best])} an epoch ({each}, exact {seconds(exact)}); powersgd changes the steps (check "
            "the accuracy), bf16 rounds the gradients to 8 significant bits")


def seconds(prediction: Prediction) -> str:
    return f"{prediction.epoch_seconds:.2f} s"


def shares_text(prediction: Prediction) -> str:
    """`sync`; on machines of different speeds `sync with equal shares` or `sync with speed shares
    (cluster.balance = "speed")`."""
    if prediction.balance is None:
        return prediction.algorithm
    setting = ' (cluster.balance = "speed")' if prediction.balance == "speed" else ""
    return f"{prediction.algorithm} with {prediction.balance} shares{setting}"


def larger_batch(shape: Shape, layout: Layout, profile: Profile) -> int | None:
    """The smallest of 2, 4 and 8 times the batch under which communication is under half the epoch."""
    for factor in (2, 4, 8):
        bigger = Shape(**{**shape.__dict__, "batch": shape.batch * factor})
        if predict(bigger, layout, profile.compute, profile.network).communication_share <= COMMUNICATION_BOUND:
            return bigger.batch
    return None


def rows_text(rows: float | None) -> str:
    if rows is None:
        return "never"
    if rows == 0:
        return "always"
    return f"{math.ceil(rows):,}"
