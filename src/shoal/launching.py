"""Starting a job on this machine: the one owner of the rules every way of starting one shares.

`shoal train` on each machine (shoal.cli), `shoal.fit` and `shoal.resume` (shoal.api), and under
torchrun, srun or mpirun the worker of rank 0 (shoal.worker) start a job the same way: a resume
continues a run directory that holds its job.toml, and code or programs that job.toml names run
only on the user's word; a new run gets a folder that holds no run, the same path on every machine
of several; node 0 holds the run directory for every machine; the run's job.toml keeps absolute
data paths; a job its checks refuse leaves nothing behind. Each caller turns its arguments into a
`Launch` and runs it. The supervisor (shoal.cluster.node), which imports no training, gets the
launch's plain values (`NodeJob`) and the launch itself as its `JobHooks`, answered with training's
functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.algorithms import make_algorithm, trainer_ranks
from shoal.cluster.node.rendezvous import Nodes, require_secret
from shoal.code import job_code, job_destinations, object_file
from shoal.config import GROUP_BY_MACHINE, ClusterConfig, JobConfig, apply_overrides, parse_override
from shoal.data.balance import equal_plan
from shoal.data.source import readable_here
from shoal.errors import ConfigError, ShoalError
from shoal.events import JobRestarted, Membership, read_history
from shoal.jobs import from_dict, load_job
from shoal.model import check_trusted
from shoal.run.directory import JOB_FILE, check_new_run_dir, new_run_dir, write_job_file
from shoal.run.lock import hold_run_dir
from shoal.train import exits
from shoal.train.checkpoint import check_resumable, newest_epoch
from shoal.train.loggers import check_installed
from shoal.train.prepare import Prepared, check_device, check_world_size, prepare

if TYPE_CHECKING:
    from shoal.cluster.node.forkserver import ForkServer
    from shoal.cluster.node.supervisor import NodeJob


@dataclass
class Launch:
    """One job started on this machine: `run` checks it, holds and writes its run directory and runs its
    workers through the supervisor."""

    job: JobConfig
    """The resolved job; its local data paths are made absolute, as the run's job.toml keeps them."""
    run_dir: Path
    nodes: Nodes = field(default_factory=Nodes)
    resume: bool = False
    max_restarts: int = 0
    callbacks: Path | None = None
    """The caller's callbacks, written by value (`shoal.fit(callbacks=...)`), for the coordinator."""
    server: ForkServer | None = None
    """The caller's fork server (shoal.cluster.node.forkserver), which every attempt's workers fork from."""
    _opened: Prepared | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        absolute_data_paths(self.job)

    @classmethod
    def create(cls, job: JobConfig, run_dir: Path | None = None, nodes: Nodes | None = None, *,
               resume: bool = False, **options) -> Launch:
        """A launch on this node of `nodes` (checked first: its rank, and a secret for several machines), in
        `run_dir` when it resumes, else in a new run's directory (`new_run_directory`)."""
        nodes = nodes or Nodes()
        check_nodes(nodes)
        if not resume:
            run_dir = new_run_directory(job, run_dir, nodes)
        return cls(job, run_dir, nodes, resume=resume, **options)

    @property
    def streamed(self) -> bool:
        """This machine lacks one of the job's datasets: it reads them once the first machine serves them."""
        return self.nodes.count > 1 and not all(readable_here(path) for path in self.datasets)

    @property
    def datasets(self) -> list[str]:
        return [path for path in (self.job.data.train, self.job.data.test) if path]

    def opened(self) -> Prepared:
        """The job's datasets and model, opened once for every check that reads them."""
        if self._opened is None:
            self._opened = prepare(self.job, run_dir=self.run_dir)
        return self._opened

    def check(self) -> None:
        """What the job must pass before its run directory is written: its loggers installed, a shipped model
        in the run directory, its data and model (opened here, unless another machine serves the data), its
        device and, on one machine, its layout (across machines the total is known once all have met)."""
        check_installed(self.job.output.loggers)
        if self.job.model.object:  # a shipped model is read from the run directory only: a missing one stops here
            object_file(self.job.model.object, self.run_dir)
        if not self.streamed:
            self.opened()
        check_device(self.job)
        if self.nodes.count == 1:
            self.check_world(self.job.cluster.workers)

    def holds(self) -> bool:
        """Whether this node holds the run directory: node 0 holds it for every machine (they share it on a
        shared filesystem)."""
        return self.nodes.count == 1 or self.nodes.rank == 0

    def hold(self) -> contextlib.AbstractContextManager:
        """The run directory's lock for the whole job where this node holds it (`holds`): another job there
        is turned away at once."""
        return hold_run_dir(self.run_dir) if self.holds() else contextlib.nullcontext()

    def write(self, replace: bool = True) -> Path:
        """The resolved job into the run directory (made if missing), as every worker and a resume read it
        (a job.toml already there is kept when `replace` is false). Returns its path."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.job.output.run_dir = str(self.run_dir)
        return write_job_file(self.run_dir, self.job, replace=replace)

    def run(self, here: Callable[[Path], None] | None = None) -> None:
        """Check the job, write its resolved file into this machine's run directory and run its workers
        (forked from `server`, where there is one), or with `here` (fit's workers=0) call it with that file
        instead, to run the one worker in this process.

        A failed attempt is recorded in the events; with restarts left, every machine's workers start
        again from the newest checkpoint. Errors in the user's input (exit status 2, a NaN loss among
        them) would fail again the same way and are not retried.
        """
        with contextlib.ExitStack() as held:
            if self.resume:  # a run still going is turned away before its data is read
                held.enter_context(self.hold())
            self.check()
            if not self.resume and self.holds():  # held only now: a job refused by its checks leaves no folder
                held.enter_context(self.hold())
                check_new_run_dir(self.run_dir)  # another job may have taken it since it was chosen
            job_file = self.write()
            if here is not None:
                return here(job_file)
            # the supervisor's modules are a launcher's: rank 0 under torchrun imports this module without them
            from shoal.cluster.node.supervisor import supervise

            supervise(self.node_job(job_file), self.nodes, self)

    def node_job(self, job_file: Path) -> NodeJob:
        """What the supervisor runs on this node: the launch's plain values."""
        from shoal.cluster.node.supervisor import NodeJob

        return NodeJob(job_file, self.run_dir, self.job.cluster, datasets=self.datasets, streamed=self.streamed,
                       elastic=self.nodes.elastic, resume=self.resume, max_restarts=self.max_restarts,
                       callbacks=self.callbacks, server=self.server)

    def check_world(self, world_size: int) -> None:
        """What `world_size` workers in all must fit: the algorithm's and the rows' checks, and a resume's
        checkpoints (another world size is resharded)."""
        opened = self.opened()
        check_world_size(self.job, world_size, opened.train_set)
        if self.resume:
            check_resumable(self.run_dir, self.job, opened.spec, opened.train_set, world_size)

    # the supervisor's JobHooks (shoal.cluster.node.supervisor), answered with training's functions

    def check_layout(self, world_size: int) -> None:
        """`check_world` once the machines have met; one machine's was checked before its run was written."""
        if self.nodes.count > 1:
            self.check_world(world_size)

    def restart_record(self, run_dir: Path, restart: int) -> JobRestarted:
        return exits.restart_record(run_dir, restart)

    def membership_record(self, run_dir: Path, world_size: int) -> Membership:
        """A `membership` event's checkpoint epoch and shares for `world_size` workers in all (the supervisor adds
        the machines): equal shares of the training rows, as the next epoch starts with (speed shares are
        measured again from equal ones)."""
        job = self.job
        groups = 1 if job.cluster.groups == GROUP_BY_MACHINE else job.cluster.groups
        trainers = len(trainer_ranks(make_algorithm(job.algorithm.name, job.algorithm.options, groups), world_size))
        shares = list(equal_plan(self.opened().train_set.rows, trainers, job.train.batch_size).shares)
        fixed = isinstance(job.cluster.balance, list)  # a fixed speed list's shares: in data_loaded
        return Membership(from_epoch=newest_epoch(run_dir), world_size=world_size, shares=None if fixed else shares)


def check_nodes(nodes: Nodes) -> None:
    """This node's place among the machines: a fixed job's machines are numbered 0..N-1; in a job of changing
    machines they are numbered as they join (the endpoint's machine is node 0). Several machines started by hand
    need a secret (`require_secret`), before anything of the run is written."""
    if nodes.rank is not None and not 0 <= nodes.rank < (1 if nodes.elastic else nodes.count):
        raise ShoalError(f"--node-rank: must be in 0..{nodes.count - 1}, got {nodes.rank}" if not nodes.elastic else
                         f"--node-rank: with --nnodes {nodes.minimum}:{nodes.count} machines are numbered as they "
                         "join: give none (the endpoint's machine is node 0)")
    require_secret(nodes)


def new_run_directory(job: JobConfig, given: str | Path | None = None, nodes: Nodes | None = None) -> Path:
    """A new run's directory: `given`, the job's output.run_dir, or runs/<job>-<date>-<time>; never one that
    holds a run. Every machine of several names the same path (each would pick its own dated folder, and a
    resume would not find the others'); one that may join a running job finds the first machine's run there."""
    nodes = nodes or Nodes()
    if nodes.count > 1 and given is None and not job.output.run_dir:
        raise ShoalError("--run-dir: required with --nnodes > 1 (the same path on every machine)")
    return new_run_dir(job, given, joining=nodes.count > 1 and nodes.rank != 0)


def absolute_data_paths(job: JobConfig) -> None:
    """The job's local data folders as absolute paths, as read from here: the run's job.toml keeps them,
    so that a resume from another folder reads the same data. A URI is left as it is."""
    data = job.data
    data.train = _absolute(data.train)
    data.test = _absolute(data.test)
    data.cache_dir = _absolute(data.cache_dir)


def _absolute(path: str | None) -> str | None:
    return path if not path or "://" in path else str(Path(path).absolute())


def final_metrics(run_dir: str | Path) -> dict:
    """The final test metrics of a finished run (empty without a test set), read from its events."""
    history = read_history(run_dir)
    return (history.end.test if history.end is not None else None) or {}


def resolve_job(job: str | Path | JobConfig | dict, overrides=(), workers: int | None = None,
                workers_name: str = "--workers") -> JobConfig:
    """A validated JobConfig from a file, a dict or a config object, with overrides applied; `workers_name`: what
    the user called the worker count (the command's option, or fit's argument)."""
    overrides = list(overrides)
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"{workers_name}: must be an integer >= 1, got {workers!r}")
        overrides.append(f"cluster.workers={workers}")
    if isinstance(job, JobConfig):
        job = job.to_dict() | {"name": job.name}
    if isinstance(job, dict):
        return from_dict(apply_overrides(job, overrides), name=job.get("name", "job"))
    return load_job(job, overrides)


def job_to_run(job_file: Path | None, resume: Path | None, overrides=(), trust_code: bool = False) -> JobConfig:
    """The job `shoal train` starts: the job file named, or the job.toml of the run directory to `resume`
    (data anyone may have written: `resumed_job`); a resume may name the job file again."""
    if resume is not None and not (resume / JOB_FILE).exists():
        raise ShoalError(f"{resume}: no job.toml: not a shoal run directory")
    if resume is None and job_file is None:
        raise ShoalError("train: give a job file, or --resume RUN_DIR")
    if trust_code and resume is None:
        raise ShoalError("--trust-code: only with --resume RUN_DIR (a job file you name is trusted as it is)")
    if job_file is None:
        return resumed_job(resume, overrides, trust_code)
    return resolve_job(job_file, overrides)


def resumed_job(run_dir: str | Path, overrides=(), trust_code: bool = False) -> JobConfig:
    """The job of a run directory to resume, with overrides applied.

    Its job.toml is data anyone may have written: code it names (a model.factory, a model.object, a
    train.loss, train.step, data.transform, scheduler factory or metric function) is loaded (in the
    launcher and every worker) only when the user trusts the run directory, or names that factory again
    in the overrides; so is the MLflow logger it names, which would send the run's settings and metrics
    to the server of its choosing (`job_destinations`).
    """
    from shoal.fit_inputs import check_data_kept  # fit's in-memory data: its modules are not every launch's

    job_file = Path(run_dir) / JOB_FILE
    if not job_file.exists():
        raise ConfigError(f"{run_dir}: no job.toml: not a shoal run directory")
    job = resolve_job(job_file, overrides)
    check_data_kept(job, str(job_file))
    trust = trust_code or named_factory(overrides) or False
    check_trusted({"factory": job.model.factory, "object": job.model.object}, str(job_file), trust)
    given = given_keys(overrides)  # the user's other code (a loss function too): trusted, or given again
    for key, reference in job_code(job):
        if trust is not True and key not in given:
            raise ConfigError(f"{job_file}: {key} {reference!r} is code; resuming would run it: pass --trust-code "
                              f"(trust_code=True) if you trust this run directory, or give it again (--set {key}=...)")
    if not trust_code:
        check_destinations(job, job_file, given)
    return job


def named_factory(overrides) -> str | None:
    """The model.factory the user names on the command line (`--set model.factory=...`), if any."""
    named = None
    for text in overrides:
        path, value = parse_override(text)
        if path == ["model", "factory"]:
            named = value
    return named


def check_destinations(job: JobConfig, job_file: Path, given: set[str]) -> None:
    """Refuse the MLflow settings a run's job.toml names and the user did not give again (`job_destinations`)."""
    uri = job.output.mlflow_uri
    where = f"at {uri!r}" if uri is not None else "in the run directory's mlruns"
    for key, value in job_destinations(job):
        if key not in given:
            raise ConfigError(f"{job_file}: {key} {value!r}: resuming would send the run's settings (data paths "
                              f"included) and metrics to MLflow {where}: pass --trust-code (trust_code=True) if "
                              f"you trust this run directory, or give it again (--set {key}=...)")


def given_keys(overrides) -> set[str]:
    """The job keys the user gives on the command line (`--set cluster.remote=...`): their values are the user's."""
    return {".".join(parse_override(text)[0]) for text in overrides}


def check_trusted_hosts(job: JobConfig, run_dir: str | Path, overrides=(), trust_code: bool = False,
                        hosts_given: bool = False) -> None:
    """Refuse to start programs that a run directory's job.toml names: its cluster.remote runs a command here,
    its cluster.hosts starts shoal on machines of its choosing. Either runs only on the user's word
    (--trust-code), or when the user gives the value again (--set, or --hosts/--hostfile for the hosts)."""
    if trust_code:
        return
    where, given = Path(run_dir) / JOB_FILE, given_keys(overrides)
    advice = "pass --trust-code if you trust this run directory, or give it again"
    if job.cluster.remote != ClusterConfig.remote and "cluster.remote" not in given:
        raise ConfigError(f"{where}: cluster.remote {job.cluster.remote!r} would run that command here; {advice} "
                          "(--set 'cluster.remote=...')")
    if job.cluster.hosts and not hosts_given and "cluster.hosts" not in given:
        raise ConfigError(f"{where}: cluster.hosts {job.cluster.hosts} would start shoal on those hosts through "
                          f"{job.cluster.remote!r}; {advice} (--hosts)")
