"""One rank of a job in named steps: set up, load data, resume, start, run and end each epoch, finish.

Every rank runs a `Runner` (SPMD). Rank 0 also holds the `Coordinator` (events, evaluation,
the saved model). With `resume`, every rank continues from the newest valid checkpoint (each file
verified before any of it is applied, see `checkpoint`; one whose last resume failed before its
first step passed over, see `first_step`), so the job ends with the weights an uninterrupted job
would have had; one written by another number of workers is resharded (`reshard`). Each step is a
method, so tests and other entry points can drive them one by one; `finish` always runs.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from shoal.algorithms import Algorithm, Role, make_algorithm, role, trainer_ranks
from shoal.algorithms.groups import machine_groups
from shoal.cluster.collectives import Communicator
from shoal.cluster.env import DistInfo, choose_device
from shoal.cluster.environments import named
from shoal.cluster.heartbeat import Heartbeat, liveness_store, silence
from shoal.cluster.inspector import TRAIN
from shoal.cluster.requeue import EpochEndStop, StopRequested
from shoal.config import GROUP_BY_MACHINE, JobConfig
from shoal.data.loader import ShardLoader
from shoal.errors import TORCH_TIMED_OUT, PeerLost, first_line, torch_says
from shoal.events import JobStart, WorkerMemory
from shoal.train.balancer import Balancer
from shoal.train.checkpoint import (
    CHECKPOINTS,
    Checkpointer,
    agree_on_latest,
    check_resumable,
    coordinator_state,
    fingerprint,
    latest_test,
    load_rank,
)
from shoal.train.coordinator import HELD_OUT, LOGGED, Coordinator, Shares
from shoal.train.epoch_loops import Serving, Training
from shoal.train.first_step import FirstStep
from shoal.train.held_out import HeldOut
from shoal.train.loop import LOADING, EpochStats, Trainer
from shoal.train.memory import current_rss, peak_rss
from shoal.train.prepare import allocate_model, check_world_size, make_optimizer, prepare
from shoal.train.reshard import resume_resharded
from shoal.train.schedule import make_schedule
from shoal.train.state import TrainingState
from shoal.train.stopping import Stopping, epoch_metrics, stop_rule
from shoal.train.transform import Transform


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


class Runner:
    """This rank's part of the job; `run()` takes every step in order and returns rank 0's test metrics."""

    def __init__(self, job: JobConfig, info: DistInfo, run_dir: Path, threads: int, resume: bool = False,
                 comm: Communicator | None = None, stop: EpochEndStop | None = None, callbacks=(),
                 on_stall: Callable[[dict], None] | None = None):
        """`comm`: the job's communicator (default: over the process group; tests pass a fake). `stop`: a
        request to end at an epoch's end with a checkpoint (SLURM's warning before its time limit).
        `callbacks`: the user's, with `on_epoch_end(epoch, metrics)`, given to every rank and called on rank 0.
        `on_stall`: what this worker does, from the heartbeat's thread, once another has gone
        `cluster.stall_timeout` without a heartbeat, or stuck at one step as long while this one waited for it
        (given that rank's verdict; shoal.worker leaves); None: nobody is judged before a collective times
        out. Each step of `run` tells the heartbeat the phase this rank is in (`enter`)."""
        self.job, self.info, self.run_dir, self.threads, self.resuming = job, info, Path(run_dir), threads, resume
        self.comm, self.stop, self.on_stall = comm, stop, on_stall
        self.callbacks = list(callbacks)
        self.stopped: str | None = None  # why the job ended before its last epoch
        self.epochs_done = job.train.epochs
        self.coordinator: Coordinator | None = None
        self.heartbeat: Heartbeat | None = None
        self.loader: ShardLoader | None = None
        self.algorithm: Algorithm | None = None
        self.held_out: HeldOut | None = None  # this trainer's validation rows (train.validation_split)
        self.first_epoch = 0  # 0, or the epoch of the checkpoint this run resumes from
        self.note: FirstStep | None = None  # of that checkpoint, until this rank's first step is done

    def run(self) -> dict:
        try:
            self.setup()
            self.load_data()
            self.resume()
            self.start()
            for epoch in range(self.first_epoch, self.job.train.epochs):
                self.end_epoch(epoch, self.run_epoch(epoch))
                if self.stopped:
                    break
            return self.complete()
        except RuntimeError as error:
            quiet = self.heartbeat.blame() if self.heartbeat and torch_says(str(error), TORCH_TIMED_OUT) else None
            if quiet is None:
                raise
            # the rank that raised only waited: the message names the one that stopped answering
            raise PeerLost(f"worker rank {quiet['rank']} on {quiet['host']} {silence(quiet)}; "
                               f"rank {self.info.rank} waited for it ({first_line(error)})") from error
        finally:
            self.finish()

    def setup(self) -> None:
        """Device, communicator, model, optimizer and algorithm, identical on every rank."""
        job, info = self.job, self.info
        self.device = choose_device(job.cluster.device, info)
        self.comm = self.comm or Communicator(info.rank, info.world_size, device=self.device)
        # the heartbeat first, as the ranks have just met: from here on one that hangs is named
        stall = job.cluster.stall_timeout if self.on_stall is not None else None
        self.heartbeat = Heartbeat(liveness_store(info), info.rank, info.world_size, info.host,
                                   stall_timeout=stall, on_stall=self.on_stall)
        self.hosts = self.comm.all_gather_object(info.host)
        # a launcher that checked its memory first (shoal's)
        self.prepared = prepare(job, memory_checked=named(info.launcher).checks_memory, run_dir=self.run_dir)
        seed_everything(job.train.seed)  # identical initial weights on every rank
        self.model = allocate_model(self.prepared.spec, self.run_dir).to(self.device)
        self.optimizer = make_optimizer(job.train.optimizer, self.model)
        self.schedule = make_schedule(job.train.scheduler, self.optimizer, self.run_dir)
        groups = machine_groups(self.hosts) if job.cluster.groups == GROUP_BY_MACHINE else job.cluster.groups
        self.algorithm = make_algorithm(job.algorithm.name, job.algorithm.options, groups)
        self.algorithm.machines, self.algorithm.seed = machine_groups(self.hosts), job.train.seed
        check_world_size(job, info.world_size, self.prepared.train_set, self.algorithm)
        self.trainers = trainer_ranks(self.algorithm, info.world_size)
        self.role = role(self.algorithm, info.rank, info.world_size)
        self.balancer = Balancer(job.cluster.balance, self.prepared.train_set.rows, len(self.trainers),
                                 job.train.batch_size, self.algorithm.same_steps(),
                                 hosts=[self.hosts[rank] for rank in self.trainers])
        self.algorithm.weigh_by_rows = self.balancer.mode != "equal"
        self.plan = self.balancer.plan  # the plan the loader and the algorithm follow now
        self.steps = self.plan.nominal
        if info.rank == 0:
            self.coordinator = Coordinator(job, self.run_dir, self.prepared, self.model, self.device)
        self.algorithm.setup(self.model, self.optimizer, self.comm, on_update=self.after_update)
        self.algorithm.shares_changed(self.trainer_steps())
        # every rank knows whether a stop may come; only rank 0 judges
        self.stopping = Stopping(stop_rule(job.train.stop), self.callbacks if info.rank == 0 else [])
        self.stoppable = self.stopping.rule is not None or bool(self.callbacks)
        seed_everything(job.train.seed + 1 + info.rank)  # dropout differs between ranks

    def enter(self, phase: str) -> None:
        """This rank enters `phase`, as its beats tell the others: only TRAIN's can be taken for a deadlock
        (shoal.cluster.inspector); evaluating, checkpointing or loading data never is."""
        if self.heartbeat is not None:
            self.heartbeat.enter_phase(phase)

    def load_data(self) -> None:
        """Each trainer loads its share once; the coordinator reads the test set."""
        self.enter(LOADING)
        # Imports that come anyway, made before the memory count so they do not show up as the data's.
        import torch._dynamo  # noqa: F401  (the first optimizer step imports it, unless the worker defers it)

        self.memory_before_data = current_rss()
        if self.role is Role.TRAINER:
            self.loader = self.open_share()
            accumulate = self.steps if self.job.train.accumulate == "epoch" else self.job.train.accumulate
            prepared, index = self.prepared, self.trainers.index(self.info.rank)
            transform = Transform(prepared.transform, self.job.train.seed, index) if prepared.transform else None
            trainer = Trainer(self.model, self.optimizer, prepared.objective, self.algorithm, self.loader,
                              self.comm, on_step=self.after_step, schedule=self.schedule,
                              clip_norm=self.job.train.clip_norm, precision=self.job.train.precision,
                              accumulate=accumulate, step=prepared.step, transform=transform,
                              on_phase=self.heartbeat.enter_phase if self.heartbeat is not None else None)
            self.epoch_loop = Training(trainer)
            if prepared.held_out is not None:
                self.held_out = HeldOut(prepared, index, len(self.trainers), self.device)
        else:
            self.epoch_loop = Serving(self.algorithm, self.steps)
        if self.coordinator is not None:
            self.coordinator.load_test_set()

    def open_share(self) -> ShardLoader:
        job, prepared = self.job, self.prepared
        return ShardLoader(
            prepared.train_set, rank=self.trainers.index(self.info.rank), world_size=len(self.trainers),
            batch_size=job.train.batch_size, seed=job.train.seed, shuffle=job.train.shuffle,
            device=self.device, label_dtype=prepared.objective.label_dtype, sample_shape=prepared.spec["input"],
            memory_budget=job.data.memory_budget, cache_dir=job.data.cache_dir, plan=self.plan,
        )

    def trainer_steps(self) -> dict[int, int]:
        """Each training rank's steps this epoch (a parameter server serves until all their updates came)."""
        return dict(zip(self.trainers, self.plan.steps))

    def follow_plan(self) -> float:
        """Take up the balancer's plan when it moved (at an epoch's start): the seconds re-reading rows took."""
        if self.plan is self.balancer.plan:
            return 0.0
        self.plan = self.balancer.plan
        self.algorithm.shares_changed(self.trainer_steps())
        return self.loader.reshare(self.plan) if self.loader is not None else 0.0

    def resume(self) -> None:
        """With `resume`: every rank loads its part of the newest checkpoint that all ranks hold, or, written
        by another number of workers, rank 0's state, which rank 0 sends to every rank (see `reshard`)."""
        self.state = TrainingState(self.model, self.optimizer, self.algorithm, self.epoch_loop, self.device,
                                   self.schedule, self.balancer, allow_nonfinite=self.job.checkpoint.allow_nonfinite)
        coordinator = self.coordinator is not None
        # recorded in the coordinator's file only: the other ranks need not read the dataset's meta.json
        self.fingerprint = fingerprint(self.job, self.prepared.spec, self.prepared.train_set,
                                       self.info.world_size) if coordinator else {}
        if not self.resuming:
            return
        if coordinator:  # also here for jobs started by torchrun or srun, which skip the launcher's check
            check_resumable(self.run_dir, self.job, self.prepared.spec, self.prepared.train_set,
                            self.info.world_size)
        note = FirstStep(self.run_dir / CHECKPOINTS, self.info.rank)
        found = agree_on_latest(self.run_dir, self.comm, coordinator, self.state.fits, note.failed)
        if found is None:
            return
        note.begin(found.epoch, found.save)  # before any of it is applied: cleared by the first step
        self.note = note
        if found.reshard:
            resume_resharded(self.state, found, self.comm, self.job.train.seed)
        else:  # checked again as it is loaded: nothing of a file that changed since is applied
            self.state.load_state_dict(load_rank(found.path, self.info.rank, self.state.fits))
        self.first_epoch = found.epoch
        reading = self.follow_plan()  # the checkpoint's shares, held before data_loaded tells them
        if self.loader is not None:
            self.loader.load_seconds += reading
        if coordinator:
            self.coordinator.final = latest_test(found)
            self.stopping.load_state_dict(found.coordinator.get("stopping", {}))
            self.coordinator.resharded_from = found.world_size if found.reshard else None
            if found.epoch >= self.job.train.epochs:  # said once the checkpoint passed every check above
                print(f"shoal: nothing left to train: {self.run_dir} holds epoch {found.epoch} of train.epochs = "
                      f"{self.job.train.epochs}; give --set train.epochs=N (above {found.epoch}) to train on",
                      file=sys.stderr, flush=True)

    def start(self) -> None:
        """Announce the job and what each rank holds, then start every rank together."""
        self.enter("starting")
        seconds = self.loader.load_seconds if self.loader else 0.0
        self.load_seconds = self.comm.all_gather(torch.tensor([seconds], dtype=torch.float64))[:, 0].tolist()
        self.holdings = self.comm.all_gather_object(self.loader.describe() if self.loader else {"mode": "serves"})
        if self.coordinator is not None:
            self.coordinator.announce(self.first_epoch, self.details(), self.load_seconds, self.holdings,
                                      self.algorithm)
        self.checkpointer = Checkpointer(self.run_dir, self.comm, self.job.checkpoint.keep, self.hosts)
        # the coordinator's set-up must not show up as the first epoch's wait
        self.comm.barrier()
        self.began = time.perf_counter()

    def details(self) -> JobStart:
        """What `job_start` records about the job and where it runs."""
        job, prepared = self.job, self.prepared
        return JobStart(job=job.name, config=job.to_dict(), world_size=self.info.world_size,
                        trainers=len(self.trainers), hosts=self.hosts, threads=self.threads, device=str(self.device),
                        algorithm=job.algorithm.name, train_rows=prepared.train_set.rows,
                        test_rows=prepared.test_set.rows if prepared.test_set else 0, steps_per_epoch=self.steps,
                        parameters=sum(p.numel() for p in self.model.parameters()))

    def run_epoch(self, epoch: int) -> EpochStats:
        """Train (or serve) one epoch in this rank's role, on the shares the balancer planned."""
        self.enter(LOADING)
        reading = self.follow_plan()
        if self.coordinator is not None:
            self.coordinator.epoch_begins(epoch, self.loader.steps if self.loader is not None else self.steps)
        self.enter(TRAIN)
        stats = self.epoch_loop.run_epoch(epoch)
        self.enter("ending the epoch")
        stats.data += reading  # the rows a moved share added are read as part of this epoch,
        stats.reading, stats.seconds = reading, stats.seconds + reading  # not of its rate
        return stats

    def after_step(self, loss: float) -> None:
        """After every training step: the heartbeat, and on rank 0 the bar, validation and the callbacks'
        on_step (a server's rank 0 takes no steps: its callbacks hear of none)."""
        trainer = self.epoch_loop.trainer
        self.heartbeat.beat(trainer.global_step)
        if self.note is not None:
            self.first_step_done()
        if self.coordinator is not None:
            self.coordinator.after_step(trainer.epoch, trainer.global_step, trainer.step_in_epoch, loss)
            self.stopping.callbacks.step(trainer.global_step, loss)

    def after_update(self, version: int) -> None:
        """After every update a server applies (its `on_update`): the heartbeat, and validation when due."""
        self.heartbeat.beat(version)
        if self.note is not None:
            self.first_step_done()
        if self.coordinator is not None:
            self.coordinator.offer(version)
            self.coordinator.served(self.algorithm.updates_this_epoch(), self.algorithm.updates_per_epoch(),
                                    self.steps)

    def first_step_done(self) -> None:
        """This rank's first step (or update) since it resumed is done: its note of the checkpoint goes."""
        note, self.note = self.note, None
        if note is not None:
            note.done()

    def end_epoch(self, epoch: int, stats: EpochStats) -> None:
        """Every rank's statistics to the coordinator (which evaluates and records), then the checkpoint."""
        gathered = self.comm.all_gather(stats.as_tensor())
        per_rank = [EpochStats.from_tensor(gathered[rank]) for rank in self.trainers]
        shares = self.plan.shares
        # before the checkpoint, which holds the next epoch's shares; a process's first epoch judges no move
        moved = self.balancer.observe(per_rank, warm=epoch > self.first_epoch)
        if self.schedule is not None:  # every rank steps with the same loss: the mean over all trainers
            self.schedule.after_epoch(sum(s.loss_sum for s in per_rank) / max(sum(s.rows for s in per_rank), 1))
        reason, reports = None, self.epoch_reports()
        if self.coordinator is not None:
            self.enter("evaluating")
            record = self.coordinator.end_epoch(epoch, self.epoch_loop.global_step, per_rank, self.trainers,
                                                [self.hosts[rank] for rank in self.trainers], self.algorithm,
                                                Shares(self.balancer.mode, shares, moved and moved.shares,
                                                       self.balancer.taken_back), reports)
            reason = self.stopping.decide(epoch, epoch_metrics(record), self.algorithm.consensus)
            self.enter("ending the epoch")
        if self.stoppable and epoch + 1 < self.job.train.epochs:
            self.stopped = self.comm.broadcast_object(reason)  # every rank leaves at the same epoch
            if self.stopped:
                self.epochs_done = epoch + 1
        every = self.job.checkpoint.every
        due = every and ((epoch + 1) % every == 0 or epoch + 1 == self.job.train.epochs or self.stopped)
        # a job that ends here (train.stop) ends: it does not stop to go on later
        stopping = (self.stop is not None and epoch + 1 < self.job.train.epochs and not self.stopped
                    and self.stop.agreed(self.comm))
        if due or stopping:
            self.save_checkpoint(epoch + 1)
        if stopping:
            raise StopRequested(epoch + 1)

    def epoch_reports(self) -> list[dict] | None:
        """Each trainer's sums of what the user's step logged, and its metrics on the rows it holds out, for the
        coordinator; one gather, only in a job that has either."""
        if self.job.train.step is None and not self.job.train.validation_split:
            return None
        mine = {}
        if self.role is Role.TRAINER:
            mine[LOGGED] = self.epoch_loop.trainer.logged.take()
            if self.held_out is not None:  # its own replica: the algorithm's rounds of the epoch are done
                mine[HELD_OUT] = self.held_out.metrics(self.model)
        gathered = self.comm.all_gather_object(mine)
        return [gathered[rank] for rank in self.trainers]

    def save_checkpoint(self, epochs_done: int) -> None:
        self.enter("checkpointing")
        began = time.perf_counter()
        coordinator = self.coordinator
        extra = None
        if coordinator is not None:
            extra = coordinator_state(coordinator.final, self.fingerprint) | {"stopping": self.stopping.state_dict()}
        path = self.checkpointer.save(epochs_done, self.state.state_dict(), extra)
        if coordinator is not None:
            coordinator.checkpoint_written(epochs_done, path, time.perf_counter() - began)

    def complete(self) -> dict:
        """Memory figures to the coordinator, which saves the model and ends the job; returns its metrics."""
        self.enter("finishing")
        self.first_step_done()  # a resume with no epoch left to train took none
        mine = WorkerMemory(before_data=self.memory_before_data, peak=peak_rss())
        memory = [WorkerMemory(**sent) for sent in self.comm.all_gather_object(asdict(mine))]  # plain data travels
        final = {}
        if self.coordinator is not None:
            self.coordinator.complete(self.algorithm, time.perf_counter() - self.began,
                                      self.epoch_loop.global_step, memory, self.epochs_done, self.stopped,
                                      self.stopping.callbacks)
            final = self.coordinator.final
        self.comm.barrier()  # nobody leaves (and tears down the group) while the coordinator still writes
        self.heartbeat.close()
        return final

    def finish(self) -> None:
        """Always, after success or failure: close the share and the event log.

        After a failure the heartbeat beats on until the process ends, saying that this rank leaves: a
        rank that raised and is still tearing down, or has just ended, must not look like one that went quiet.
        """
        if self.heartbeat is not None:
            self.heartbeat.leave()
        if self.loader is not None:
            self.loader.close()
        if self.coordinator is not None:
            self.coordinator.close()
        if self.algorithm is not None:
            self.algorithm.close()


def run_worker(job: JobConfig, info: DistInfo, run_dir: Path, threads: int, resume: bool = False,
               stop: EpochEndStop | None = None, callbacks=(), on_stall: Callable[[dict], None] | None = None) -> dict:
    """Train this rank's part of the job; returns the final test metrics (rank 0) or {}. `on_stall`: see Runner."""
    return Runner(job, info, run_dir, threads, resume, stop=stop, callbacks=callbacks, on_stall=on_stall).run()
