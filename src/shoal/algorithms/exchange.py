"""Gradients exchanged in buckets while the backward pass computes the rest (as DDP overlaps its all-reduces).

Synchronous SGD's exchange of a model of millions of parameters takes longer on 1 GbE than the step's
compute; started only after the backward pass, it adds the two. Here the parameters are split into
buckets in the order their gradients become ready (the reverse of the model's order, as DDP starts),
and a hook on each parameter copies its gradient into its bucket, weighted by the batch's rows; a
full bucket goes to a thread of its own that exchanges it (with the job's compression) while the
backward pass goes on. Buckets are exchanged strictly in order, so every rank enters the same
collectives in the same order, whatever order its hooks fire in; a gradient that never came (a
parameter this batch did not use) counts as zeros when the backward pass ends.

After the backward pass the loop waits for the last buckets; only that wait is communication in
the epoch's time split (the rest was hidden behind the backward pass). The exchange's own clock
(`exchange_seconds`) and what it hid are reported per epoch. For the stall inspector (shoal.cluster.waits)
only that wait marks the training thread as waiting for the others: while the exchange's thread waits in
its collectives, the training thread computes the backward pass, and is busy.

With several workers on a machine and several machines (`hierarchical`), a bucket is first summed
onto the machine's first worker, the first workers exchange across machines, and the result is
broadcast within each machine: the link carries one exchange per machine, not one per worker.
The rows count travels first and exact, and each bucket is divided by it before its exchange: the
sum is then the rows-weighted mean itself, whose numbers stay a gradient's size (half precision's
range is not spent on rows), and PowerSGD's error feedback is kept in a gradient's units. Without
overlap, exact or PowerSGD, the count rides as the first bucket's last number instead (the sum divided after),
so a small model's step pays one collective's latency, not two (PowerSGD, two not three: the count
goes exact in its first all-reduce, and its error feedback is kept in rows-weighted units).

Without overlap (`overlap = false`, or "auto" where the exchange would share the backward pass's
core) there are no hooks and no thread: after the backward pass the gradients go as one bucket
(unless `bucket_mb` says otherwise), on the training thread, and only the collectives' own time is
communication (copies and a compression's arithmetic are compute).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import torch

from shoal.algorithms.compression import Compressor, Exact, HalfPrecision
from shoal.bucket_rules import cut
from shoal.cluster.waits import WAITS
from shoal.errors import ShoalError


class Bucket:
    """Consecutive parameters whose gradients travel together, in one flat buffer."""

    def __init__(self, index: int, parameters: list[torch.nn.Parameter], extra: int = 0, names: list[str] = ()):
        """`extra`: numbers after the gradients (the rows count, where it travels with them). `names`: each
        parameter's, under which a compression keeps its state (whatever bucket the parameter is in)."""
        self.index, self.parameters = index, parameters
        self.names = list(names) + (["rows"] if extra else [])
        self.offsets, total = [], 0
        for parameter in parameters:
            self.offsets.append(total)
            total += parameter.numel()
        first = parameters[0]
        self.flat = torch.zeros(total + extra, dtype=torch.float32, device=first.device)
        self.shapes = [parameter.shape for parameter in parameters] + ([torch.Size([extra])] if extra else [])
        self.filled = [False] * len(parameters)  # gradients copied in this step
        self.missing = len(parameters)

    def clear(self) -> None:
        self.filled = [False] * len(self.parameters)
        self.missing = len(self.parameters)

    def put(self, position: int, gradient: torch.Tensor | None, weight: float) -> None:
        """Copy one parameter's gradient in, times `weight` (zeros for a gradient that never came)."""
        if self.filled[position] and self.missing == 0:
            raise ShoalError(f"sync: parameter {self.names[position]} got its gradient twice in one backward pass "
                             "after its bucket was sent (reentrant checkpointing?); set algorithm.overlap = false")
        offset, size = self.offsets[position], self.parameters[position].numel()
        target = self.flat[offset : offset + size]
        if gradient is None:
            target.zero_()
        else:
            torch.mul(gradient.reshape(-1), weight, out=target)
        if not self.filled[position]:
            self.filled[position] = True
            self.missing -= 1

    def fill_rest(self, weight: float) -> None:
        """The gradients no hook brought (parameters unused by the last batch, or no hooks), as they stand after
        the backward pass (the mean over this rank's rows), times `weight`."""
        for position, parameter in enumerate(self.parameters):
            if not self.filled[position]:
                self.put(position, parameter.grad, weight)

    def take(self, divisor: torch.Tensor | None = None) -> None:
        """Make each parameter's gradient the bucket's result (divided by `divisor`, where it is a sum)."""
        for parameter, offset in zip(self.parameters, self.offsets):
            piece = self.flat[offset : offset + parameter.numel()].view_as(parameter)
            if parameter.grad is None:
                parameter.grad = (piece if divisor is None else piece / divisor).to(parameter.dtype, copy=True)
            elif divisor is None:
                parameter.grad.copy_(piece)
            else:
                torch.div(piece, divisor, out=parameter.grad)


def make_buckets(parameters: list[torch.nn.Parameter], capacity: int) -> list[Bucket]:
    """The parameters in reverse order (the backward pass's), cut into buckets of about `capacity` bytes; each
    parameter named by its place in the model ("p3"), so a compression's state follows it whatever the cut."""
    cuts = cut([parameter.numel() * 4 for parameter in parameters], capacity)
    return [Bucket(index, [parameters[position] for position in positions],
                   names=[f"p{position}" for position in positions]) for index, positions in enumerate(cuts)]


class Route:
    """Which communicators a bucket crosses: within the machine, then across machines (or the whole world)."""

    def __init__(self, world, inside=None, across=None):
        self.world, self.inside, self.across = world, inside, across

    def sum_(self, flat: torch.Tensor, shapes, key: str, compressor: Compressor, names=None) -> None:
        """The sum over every rank, the same bytes on every rank."""
        if self.inside is None:
            compressor.sum_(flat, shapes, key, self.world, names)
            return
        self.inside.reduce_sum_(flat, 0)
        if self.inside.rank == 0:
            compressor.sum_(flat, shapes, key, self.across, names)
        self.inside.broadcast_(flat, 0)

    def seconds(self) -> float:
        """The exchange's time so far (`inside` and `across` are split from `world`, whose clock counts theirs)."""
        return self.world.seconds


class ExchangeThread:
    """One daemon thread running exchanges in the order they are handed over (a daemon: a worker that fails
    while an exchange waits on its peers must still be able to exit)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.run, name="shoal-exchange", daemon=True)
        self.thread.start()

    def submit(self, function, *args) -> Future:
        future: Future = Future()
        self.jobs.put((future, function, args))
        return future

    def run(self) -> None:
        if self.device.type == "cuda":  # a new thread's current device is cuda:0
            torch.cuda.set_device(self.device)
        while True:
            job = self.jobs.get()
            if job is None:
                return
            future, function, args = job
            try:
                future.set_result(function(*args))
            except BaseException as error:  # the training thread re-raises it in finish()
                future.set_exception(error)

    def close(self) -> None:
        self.jobs.put(None)


class GradientExchange:
    """Exchanges a model's gradients in buckets; see the module's docstring."""

    def __init__(self, parameters: list[torch.nn.Parameter], comm, route: Route, compressor: Compressor, *,
                 capacity: int, overlap: bool = True):
        self.comm, self.route, self.compressor, self.overlap = comm, route, compressor, overlap
        self.buckets = make_buckets(parameters, capacity)
        # after the backward pass the rows count rides in the first bucket (exact: one collective a step; PowerSGD
        # sends it exact in its first all-reduce); half precision divides by it first, to stay in range
        self.carry_rows = not overlap and not isinstance(compressor, HalfPrecision)
        if self.carry_rows:
            first = self.buckets[0]
            self.buckets[0] = Bucket(first.index, first.parameters, extra=1, names=first.names)
        self.where = {id(p): (bucket, position) for bucket in self.buckets
                      for position, p in enumerate(bucket.parameters)}
        self.thread = ExchangeThread(parameters[0].device) if overlap else None
        self.pending: list[Future] = []
        self.launched = 0  # buckets handed to the thread this step
        self.active, self.weight, self.local_rows = False, 1.0, 0
        self.rows = torch.zeros(1, dtype=torch.float64, device=parameters[0].device)
        self.waited = 0.0  # seconds the loop waited for the exchange (its visible communication)
        self.hooks = [p.register_post_accumulate_grad_hook(self.ready) for p in parameters] if overlap else []

    def begin(self, weight: float, rows: int, final: bool) -> None:
        """Before a backward pass: `weight` turns its gradients into a rows-weighted sum; `rows` are the rows this
        rank's exchange speaks for; only a `final` backward (the last of an accumulated group) is exchanged."""
        self.active, self.weight = final and self.overlap, weight
        if not final:
            return
        self.launched = 0
        for bucket in self.buckets:
            bucket.clear()
        self.local_rows = rows
        self.rows.fill_(rows)
        if self.overlap:  # summed on the thread while the backward pass runs
            self.pending = [self.thread.submit(self.route.sum_, self.rows, [self.rows.shape], "rows", EXACT)]

    def ready(self, parameter: torch.nn.Parameter) -> None:
        """A parameter's gradient is complete: into its bucket; full buckets go out in order."""
        if not self.active:
            return
        bucket, position = self.where[id(parameter)]
        bucket.put(position, parameter.grad, self.weight)
        self.launch_ready()

    def launch_ready(self) -> None:
        while self.launched < len(self.buckets) and self.buckets[self.launched].missing == 0:
            bucket = self.buckets[self.launched]
            self.pending.append(self.thread.submit(self.send, bucket))
            self.launched += 1

    def send(self, bucket: Bucket) -> None:
        """On the thread: the bucket as this rank's part of the mean over every rank's rows (the rows' sum came
        first), then summed. Dividing before the sum keeps half precision's numbers at a gradient's size."""
        bucket.flat.div_(self.rows.to(bucket.flat.dtype))
        self.route.sum_(bucket.flat, bucket.shapes, str(bucket.index), self.compressor, bucket.names)

    def finish(self) -> None:
        """After the backward pass (each gradient now the mean over this rank's rows): send what is left, wait, and
        leave every gradient the mean over all ranks' rows."""
        self.active = False
        if self.overlap:
            self.finish_overlapped()
        elif self.carry_rows:
            self.exchange_with_rows()
            return
        else:
            self.exchange_now()
        for bucket in self.buckets:
            bucket.take()

    def finish_overlapped(self) -> None:
        """The buckets no hook completed go out too; the wait for the thread is the loop's communication."""
        for bucket in self.buckets[self.launched :]:
            bucket.fill_rest(self.local_rows)
        self.launch_ready()
        start = time.perf_counter()
        thread = WAITS.enter()  # the training thread now waits for the others, through the exchange's thread
        try:
            for future in self.pending:
                future.result()
        finally:
            WAITS.leave(thread)
            waited = time.perf_counter() - start
            self.waited += waited
            self.comm.count(waited)
            self.pending = []

    def exchange_now(self) -> None:
        """Without overlap, on the training thread: the rows' sum, then each bucket filled already divided by it
        (one pass over the gradients) and summed. Only the collectives' time is communication; copies and a
        compression's arithmetic are compute."""
        before = self.route.seconds()
        self.route.sum_(self.rows, [self.rows.shape], "rows", EXACT)
        share = self.local_rows / float(self.rows)
        for bucket in self.buckets:
            bucket.fill_rest(share)
            self.route.sum_(bucket.flat, bucket.shapes, str(bucket.index), self.compressor, bucket.names)
        spent = self.route.seconds() - before
        self.waited += spent
        self.comm.count(spent)

    def exchange_with_rows(self) -> None:
        """Without overlap: rows-weighted sums with the rows count in the first bucket's last number, summed in the
        same collectives, then divided as each gradient is set (one pass either side). PowerSGD's error feedback
        is then kept in rows-weighted units."""
        before = self.route.seconds()
        for bucket in self.buckets:
            bucket.fill_rest(self.local_rows)
        self.buckets[0].flat[-1] = self.local_rows
        for bucket in self.buckets:
            self.route.sum_(bucket.flat, bucket.shapes, str(bucket.index), self.compressor, bucket.names)
        spent = self.route.seconds() - before
        self.waited += spent
        self.comm.count(spent)
        total = self.buckets[0].flat[-1:].clone()
        for bucket in self.buckets:
            bucket.take(total)

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        if self.thread is not None:
            self.thread.close()


EXACT = Exact()  # the rows count is never compressed
