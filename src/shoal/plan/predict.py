"""Predicted epoch and job time of one job on one cluster shape, from a profile of measured costs.

Each algorithm's communication is priced from what it really sends (shoal.algorithms): sync an
exchange of the gradients every step, in buckets, compressed and overlapped with the backward pass
as its options say (shoal.plan.exchange); averaging and synchronous EASGD an all-reduce of the
weights every period (compressed, as `algorithm.compression` says), within groups every group
period; Downpour and asynchronous EASGD a message to the server and a reply every `sync_every` (or
`period`) steps, the server being a queue its trainers share. Every message of these costs the link's
latency and its bytes over the link's rate (shoal.plan.costs.Link), so many small messages pay their
count and few large ones their bytes. An epoch is `steps x per-step cost + per-epoch cost`, so the
same numbers give the table's epoch and the straight line in dataset size whose crossings are the
cluster sizes worth paying for.

Machines may differ (`Layout.speeds`): with equal shares the slowest trainer sets the epoch's pace
(rows / trainers at its rate), with speed shares (cluster.balance = "speed") every trainer's share
takes as long (rows over the sum of the rates); the communication is priced as on even machines.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from shoal.config import GROUP_BY_MACHINE
from shoal.data.holdout import held_out_count
from shoal.plan.costs import Line, closed_queue, hierarchical_all_reduce, ring_all_reduce
from shoal.plan.exchange import (
    BACKWARD_SHARE,
    STEP_MULTIPLY_ADDS,
    StepExchange,
    SyncOptions,
    Topology,
    payloads,
    step_exchange,
)
from shoal.plan.profile import Compute, Network

VALUE_BYTES = 4  # float32 on the wire
# Averaging's outer step (shoal.algorithms.outer), in passes over the parameters: the averaged change, its copy
# into the stepped tensor, the momentum buffer (a multiply and an add), Nesterov's look-ahead, the step, the new
# consensus, the anchor's copy and the weights written back; each priced as a copy of the parameters.
OUTER_PASSES = 9
HEADER_BYTES = 64  # a server message's header (shoal.cluster.messages)
RENDEZVOUS_MESSAGES = 4  # store round trips each node makes to join
# The coordinator's evaluation between epochs over the probe's, timed back to back: 1.07-1.67x (median 1.29) over
# two runs of the digits example's 3 epochs (100k test rows) on an emulated host of a 2-core VM,
# benchmarks/results/2026-11-28-2core-cpu-link-efficiency.md: it runs after an epoch of other work.
EVALUATION_COLD = 1.3


@dataclass(frozen=True)
class Shape:
    """What the planner needs of a job: the model's size, the data, the loop and the algorithm."""

    parameters: int
    buffers: int
    rows: int
    test_rows: int
    batch: int
    epochs: int
    eval_every: int
    algorithm: str
    options: dict
    groups: int | str = 1
    """cluster.groups: a count, or "machine" (one group of each machine's workers)."""
    balance: str = "equal"
    """How the epoch's rows are shared among the trainers: "equal", or "speed" (in proportion to their speeds)."""
    parameter_shapes: tuple[tuple[int, ...], ...] = ()
    """Each trainable parameter's shape (what PowerSGD can factor); empty: priced as one vector."""
    accumulate: int | str | None = None
    """train.accumulate: batches summed into one update (sync's one exchange), "epoch" for a share's whole."""
    validation_split: float = 0.0
    """train.validation_split: the share of the rows held out of training, validated by the trainers after each
    epoch."""


@dataclass(frozen=True)
class Layout:
    nodes: int
    per_node: int
    speeds: tuple[float, ...] = ()
    """Each machine's speed, node by node: its workers step that many times as fast as the profile's machine
    (0.5: half as fast). Empty: every machine is the profile's, the slower host as the network probe timed it."""

    def __post_init__(self) -> None:
        if self.speeds and (len(self.speeds) != self.nodes or not all(speed > 0 for speed in self.speeds)):
            raise ValueError(f"a layout of {self.nodes} node(s) needs as many speeds > 0, got {self.speeds!r}")

    @property
    def workers(self) -> int:
        return self.nodes * self.per_node

    def worker_speeds(self) -> list[float]:
        """Each worker's speed in rank order (ranks are placed machine by machine); 1 on even machines."""
        return [speed for speed in self.speeds or (1.0,) * self.nodes for _ in range(self.per_node)]


@dataclass(frozen=True)
class StepCosts:
    """An algorithm's costs for one trainer: compute per step; an exchange (`round`) every `period` steps
    and one more for steps left over at the epoch's end; group rounds priced per step; and per epoch."""

    compute: float
    round: float = 0.0
    period: int = 1
    round_bytes: float = 0.0
    communication: float = 0.0
    epoch_compute: float = 0.0
    epoch_communication: float = 0.0
    epoch_bytes: float = 0.0
    staleness: float | None = None

    def rounds(self, steps: int) -> int:
        return math.ceil(steps / self.period) if self.round else 0

    def per_step(self) -> float:
        """Seconds per step with the rounds spread over their steps (the straight line in dataset size)."""
        return self.compute + self.communication + self.round / self.period


@dataclass(frozen=True)
class Prediction:
    algorithm: str
    nodes: int
    workers: int
    trainers: int
    rows: int
    steps: int
    epoch_seconds: float
    compute_seconds: float
    communication_seconds: float
    evaluation_seconds: float
    startup_seconds: float
    load_seconds: float
    job_seconds: float
    bytes_per_epoch: float
    staleness: float | None
    line: Line
    """Job seconds against training rows (steps taken as rows / (trainers x batch)): crossings between
    cluster sizes."""
    balance: str | None = None
    """On machines of different speeds, how the rows were shared: "equal" or "speed"; None on even machines."""
    validation_seconds: float = 0.0
    """Each epoch's validation of the held-out rows (train.validation_split), after the epoch's time."""

    @property
    def communication_share(self) -> float:
        return self.communication_seconds / self.epoch_seconds if self.epoch_seconds > 0 else 0.0

    @property
    def label(self) -> str:
        """The algorithm, and on machines of different speeds how the rows were shared: a series of the plan."""
        return self.algorithm if self.balance is None else f"{self.algorithm}, {self.balance} shares"


def epoch_steps(shape: Shape, layout: Layout) -> int:
    """Steps in a trainer's epoch: its share of the rows trained on in batches, the last one short."""
    return math.ceil((training_rows(shape) // trainers(shape, layout)) / shape.batch)


def training_rows(shape: Shape) -> int:
    """The rows trained on: those train.validation_split holds out are validated after each epoch instead (a
    fifth of Kennedy's rows: without them, the plan priced 25% more steps than the job took)."""
    return shape.rows - held_out_count(shape.rows, shape.validation_split)


def group_count(shape: Shape, layout: Layout) -> int:
    """The training workers' groups: cluster.groups, or one per machine."""
    return layout.nodes if shape.groups == GROUP_BY_MACHINE else shape.groups


def trainers(shape: Shape, layout: Layout) -> int:
    """Ranks that train: all of them, less a parameter server and its sub-masters."""
    if not is_server(shape):
        return layout.workers
    groups = group_count(shape, layout)
    return layout.workers - 1 - (groups if groups > 1 else 0)


def is_server(shape: Shape) -> bool:
    """Downpour, and EASGD unless `synchronous = true` (its default is the asynchronous server)."""
    return shape.algorithm == "downpour" or (shape.algorithm == "easgd" and not shape.options.get("synchronous", False))


def spread(compute: Compute, workers: int, steps: int = 1) -> float:
    """The mean extra wait for the slowest of `workers` at a barrier `steps` steps after the last, scaled from
    the measured pair by the expected maximum of that many normal draws (Blom's approximation) and by the root
    of the steps summed."""
    if workers <= 1 or compute.step_spread <= 0:
        return 0.0
    return compute.step_spread * _expected_maximum(workers) / _expected_maximum(2) * math.sqrt(steps)


def _expected_maximum(draws: int) -> float:
    return statistics.NormalDist().inv_cdf((draws - 0.375) / (draws + 0.25))


def trainer_speeds(shape: Shape, layout: Layout) -> list[float]:
    """The speeds of the ranks that train: a server and its sub-masters are the first ranks, on the first
    machine."""
    speeds = layout.worker_speeds()
    return speeds[len(speeds) - trainers(shape, layout):]


def machine_pace(shape: Shape, layout: Layout, network: Network) -> float:
    """How many times a step on the profile's machine the trainers' epoch of compute takes: with equal shares
    the slowest trainer's pace; with speed shares each trainer's share takes rows over the sum of the rates, so
    the mean speed's. On even machines, the slower host as the network probe timed them side by side."""
    if not layout.speeds:
        return network.slowest_host if layout.nodes > 1 else 1.0
    speeds = trainer_speeds(shape, layout)
    return len(speeds) / sum(speeds) if shape.balance == "speed" else 1 / min(speeds)


def slowest_pace(pace_range: float, workers: int) -> float:
    """How much slower than one worker the slowest of `workers` runs, each worker's pace moving on its own
    across the measured range (`Compute.pace_range`: its slowest step over its fastest): modelled as half of
    the time at either end, as a VM's cores flip between two levels in spells of seconds, the slowest of N is
    at the slow end but for a 2^-N share of the time. 1 on a steady machine; at most 2r/(1+r) however many."""
    if workers <= 1 or pace_range <= 1.0:
        return 1.0
    typical = (1 + pace_range) / 2
    return (pace_range - (pace_range - 1) / 2 ** workers) / typical


def copy_seconds(compute: Compute, values: float) -> float:
    return compute.copy_seconds_per_byte * values * VALUE_BYTES


def ring(size: float, layout: Layout, network: Network) -> float:
    return hierarchical_all_reduce(size, layout.nodes, layout.per_node, network.inside, network.across)


def sync_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    """The gradients (and a row count) exchanged in buckets after each backward pass, or during it with
    overlap, as the job's compression sends them (shoal.plan.exchange); only the wait counts as communication."""
    step = compute.step(shape.batch)
    if layout.workers <= 1:
        return StepCosts(compute=step)
    exchange = sync_exchange(shape, layout, compute, network)
    options = SyncOptions.of(shape.options)
    buffers = ring(shape.buffers * VALUE_BYTES, layout, network) if shape.buffers else 0.0
    # batches summed into each exchange and step: train.accumulate's, or the whole share's (cNeural's batch mode)
    together = epoch_steps(shape, layout) if shape.accumulate == "epoch" else int(shape.accumulate or 1)
    wait = exchange.exposed(BACKWARD_SHARE * step, options.overlap) + spread(compute, layout.workers, together)
    update = 3 * copy_seconds(compute, shape.parameters) + exchange.compute + compute.resume(wait)
    if shape.accumulate == "epoch":
        return StepCosts(compute=step, epoch_compute=update, epoch_communication=wait + buffers,
                         epoch_bytes=exchange.bytes_sent)
    return StepCosts(compute=step + update / together, round=wait, period=together, round_bytes=exchange.bytes_sent,
                     epoch_communication=buffers)


def sync_exchange(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepExchange:
    """One step's exchange of `shape`'s gradients under its [algorithm] options."""
    multiply_add = compute.step(shape.batch) / (STEP_MULTIPLY_ADDS * shape.batch * max(shape.parameters, 1))
    return step_exchange(shape.parameters, shape.parameter_shapes, SyncOptions.of(shape.options),
                         Topology(layout.nodes, layout.per_node, network.across, network.inside),
                         multiply_add=multiply_add, copy_per_value=compute.copy_seconds_per_byte * VALUE_BYTES)


def averaging_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    """Local steps; the weights (and float buffers) averaged every period, within groups every group period; with
    `outer`, each round across all workers also takes the outer optimizer's step (OUTER_PASSES over the parameters)."""
    values = shape.parameters + shape.buffers
    outer = OUTER_PASSES * shape.parameters if shape.options.get("outer") else 0
    return _rounds(shape, layout, compute, network, values, extra_copies=2, outer_values=outer)


def elastic_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    """Synchronous EASGD: an all-reduce of the elastic differences every period (default 4 steps)."""
    options = {"period": 4, **shape.options}
    return _rounds(Shape(**{**shape.__dict__, "options": options}), layout, compute, network, shape.parameters,
                   extra_copies=6)


def _rounds(shape: Shape, layout: Layout, compute: Compute, network: Network, values: int,
            extra_copies: int, outer_values: int = 0) -> StepCosts:
    """Rounds across all workers every `period` steps (or once an epoch), and within groups every
    `group_period`: their cost spread over the steps between them. `outer_values`: numbers a round across all
    workers also reads and writes once each, priced as copies (averaging's outer step)."""
    step = compute.step(shape.batch)
    period, group_period = shape.options.get("period", "epoch"), shape.options.get("group_period")
    if layout.workers <= 1:  # no exchange; an outer step all the same
        outer = copy_seconds(compute, outer_values)
        return StepCosts(compute=step, epoch_compute=outer) if period == "epoch" else \
            StepCosts(compute=step + outer / period)
    size = values * VALUE_BYTES
    sizes = round_payloads(shape, values)  # a round across all workers, compressed as the job says
    round_seconds = sum(ring(part, layout, network) for part in sizes)
    round_copies = extra_copies * copy_seconds(compute, values)
    sent = sum(ring_all_reduce(part, layout.workers).bytes_sent for part in sizes)
    if group_period is not None:
        inside = Layout(1, max(1, layout.workers // max(1, group_count(shape, layout))))
        group_round = ring(size, inside, network) if layout.per_node >= inside.per_node else round_seconds
        wait = spread(compute, inside.per_node, group_period)
        step += (round_copies + compute.resume(group_round + wait)) / group_period
        communication = (group_round + wait) / group_period
    else:
        communication = 0.0
    # each round's barrier waits for the slowest worker's steps since the last: a whole epoch's, once an epoch
    wait = spread(compute, layout.workers, epoch_steps(shape, layout) if period == "epoch" else period)
    round_copies += copy_seconds(compute, outer_values)
    if period == "epoch":
        return StepCosts(compute=step, communication=communication,
                         epoch_compute=round_copies + compute.resume(round_seconds + wait),
                         epoch_communication=round_seconds + wait, epoch_bytes=sent)
    return StepCosts(compute=step + (round_copies + compute.resume(round_seconds + wait)) / period,
                     communication=communication, round=round_seconds + wait, period=period, round_bytes=sent)


def round_payloads(shape: Shape, values: int) -> list[float]:
    """Bytes of each all-reduce of a round across all workers: `values` fp32 numbers, or what `algorithm.compression`
    sends of them (averaging's differences from the consensus, EASGD's elastic differences; buffers as vectors)."""
    compression = shape.options.get("compression", "none")
    if compression == "none":
        return [float(values * VALUE_BYTES)]
    shapes = shape.parameter_shapes or ((shape.parameters,),)
    if values > shape.parameters:
        shapes = (*shapes, (values - shape.parameters,))
    options = SyncOptions(compression=compression, rank=int(shape.options.get("compression_rank", 4)))
    return payloads(shapes, options)


def server_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    """A parameter server as a closed queue: each trainer works `every` steps, sends its update, and waits
    while the server's link and processor serve it behind the other trainers' updates."""
    every = _exchange_period(shape)
    link = network.message() if layout.nodes > 1 else network.inside
    update = (shape.parameters + shape.buffers) * VALUE_BYTES + HEADER_BYTES
    reply = shape.parameters * VALUE_BYTES + HEADER_BYTES
    # a Downpour trainer does not step its own optimizer: it adds its gradients to the update instead
    local = 0.0 if shape.algorithm == "easgd" else copy_seconds(compute, shape.parameters) - compute.update_seconds
    work = every * max(compute.step(shape.batch) + local, 0.0) + 2 * copy_seconds(compute, shape.parameters)
    serve = compute.update_seconds + 3 * copy_seconds(compute, shape.parameters)
    # the server's link is shared: each message's time beyond the fixed per-message cost queues there
    transfers = [max(link.seconds(update) - link.latency, 0.0), max(link.seconds(reply) - link.latency, 0.0)]
    cycle, _ = _server_cycle(shape, layout, compute, [serve, *transfers], work + 2 * link.latency)
    # back from their waits both ends find their caches cold: the trainer after each exchange, the server
    # after each pause between updates (on a 2-core VM every Downpour row's wait was priced short without it)
    work += compute.resume(cycle - work)
    serve += compute.resume(_server_idle(shape, layout, compute, serve, cycle))
    cycle, staleness = _server_cycle(shape, layout, compute, [serve, *transfers], work + 2 * link.latency)
    return StepCosts(compute=work / every, round=cycle - work, period=every, round_bytes=update + reply,
                     staleness=staleness)


def _server_cycle(shape: Shape, layout: Layout, compute: Compute, services: list[float],
                  think: float) -> tuple[float, float]:
    """(a trainer's seconds from one exchange to the next, the staleness of its updates)."""
    clients = trainers(shape, layout)
    if shape.options.get("synchronous", False):
        combining = (clients - 1) * copy_seconds(compute, shape.parameters)  # the server sums the updates
        return think + clients * sum(services[1:]) + services[0] + combining, 0.0
    queue = closed_queue(services, think, clients)
    return queue.cycle, max(queue.throughput * queue.cycle - 1, 0.0)


def _server_idle(shape: Shape, layout: Layout, compute: Compute, serve: float, cycle: float) -> float:
    """Seconds the server's processor sits idle before each update it applies: a trainer's cycle less the
    processing the server does in it, shared among the updates of the cycle."""
    clients = trainers(shape, layout)
    if shape.options.get("synchronous", False):  # one step per round, after summing every trainer's update
        return max(cycle - serve - (clients - 1) * copy_seconds(compute, shape.parameters), 0.0)
    return max(cycle / clients - serve, 0.0)


def _exchange_period(shape: Shape) -> int:
    if shape.algorithm == "downpour":
        return int(shape.options.get("sync_every", 1))
    period = shape.options.get("period", 4)
    return 10**9 if period == "epoch" else int(period)


def plain_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    return StepCosts(compute=compute.step(shape.batch))


def algorithm_costs(shape: Shape, layout: Layout, compute: Compute, network: Network) -> StepCosts:
    if is_server(shape):
        return server_costs(shape, layout, compute, network)
    pricing = {"sync": sync_costs, "averaging": averaging_costs, "easgd": elastic_costs, "none": plain_costs}
    return pricing[shape.algorithm](shape, layout, compute, network)


def pace(shape: Shape, layout: Layout, compute: Compute, network: Network) -> float:
    """How many times its measured step a trainer's step takes in this cluster: the slowest machine's pace (or
    speed shares' mean), or the slowest of the workers that wait for one another when each one's pace moves on
    its own. On machines of given speeds, that movement comes on top of each one's speed; a machine's speed
    scales its steps, not its copies or a server's updates."""
    moving = 1.0 if is_server(shape) else slowest_pace(compute.pace_range, trainers(shape, layout))
    machines = machine_pace(shape, layout, network)
    return machines * moving if layout.speeds else max(machines, moving)


def predict(shape: Shape, layout: Layout, compute: Compute, network: Network) -> Prediction:
    """Seconds per epoch (the slowest trainer's, as `epoch_end` records it) and for the whole job."""
    count = trainers(shape, layout)
    factor = pace(shape, layout, compute, network)
    # rank 0, which evaluates, runs on the first machine
    evaluate_seconds_per_row = compute.evaluate_seconds_per_row / (layout.speeds[0] if layout.speeds else 1.0)
    if factor != 1.0:
        compute = dataclasses.replace(compute, step_seconds={batch: seconds * factor
                                                             for batch, seconds in compute.step_seconds.items()})
    costs = algorithm_costs(shape, layout, compute, network)
    steps = epoch_steps(shape, layout)
    compute_seconds = steps * costs.compute + costs.epoch_compute
    communication = steps * costs.communication + costs.rounds(steps) * costs.round + costs.epoch_communication
    epoch = compute_seconds + communication
    evaluations = len([e for e in range(1, shape.epochs + 1) if e % shape.eval_every == 0 or e == shape.epochs])
    evaluation = shape.test_rows * evaluate_seconds_per_row * EVALUATION_COLD  # on rank 0, the first machine
    # each trainer validates its slice of the held-out rows after the epoch, outside its time as epoch_end has it
    validate_per_row = compute.evaluate_seconds_per_row * factor
    validation = (shape.rows - training_rows(shape)) / count * validate_per_row
    joining = RENDEZVOUS_MESSAGES * network.across.latency * layout.nodes * (layout.nodes > 1)
    startup = compute.startup_seconds + compute.startup_per_node * layout.nodes + joining
    load = (shape.rows / count) / compute.load_rows_per_second
    fixed = startup + shape.epochs * (costs.epoch_compute + costs.epoch_communication) + evaluations * evaluation
    split = shape.validation_split  # of each row: the share validated, the rest trained on
    per_row = (1 / compute.load_rows_per_second
               + shape.epochs * ((1 - split) * costs.per_step() / shape.batch + split * validate_per_row)) / count
    return Prediction(algorithm=name(shape), nodes=layout.nodes, workers=layout.workers, trainers=count,
                      rows=shape.rows, steps=steps, epoch_seconds=epoch, compute_seconds=compute_seconds,
                      communication_seconds=communication,
                      evaluation_seconds=evaluation if shape.test_rows else 0.0, startup_seconds=startup,
                      load_seconds=load, validation_seconds=validation,
                      job_seconds=startup + load + shape.epochs * (epoch + validation) + evaluations * evaluation,
                      bytes_per_epoch=costs.rounds(steps) * costs.round_bytes + costs.epoch_bytes,
                      staleness=costs.staleness, line=Line(fixed, per_row),
                      balance=shape.balance if layout.speeds else None)


def name(shape: Shape) -> str:
    if shape.algorithm == "easgd":
        return "easgd (server)" if is_server(shape) else "easgd"
    return shape.algorithm
