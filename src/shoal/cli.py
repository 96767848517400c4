"""The `shoal` command: argparse subcommands that map onto the Python API, no logic of their own."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from shoal.errors import EXIT_USAGE, ShoalError, WorkerError

DESCRIPTION = "shoal: train one neural network across many commodity machines."


def command_train(args: argparse.Namespace) -> int:
    from shoal.cluster.node import forkserver

    # this machine runs workers: they import while this process does
    with forkserver.serving(wanted=not (args.hosts or args.hostfile)) as server:
        return train_here(args, server)


def train_here(args: argparse.Namespace, server=None) -> int:
    """`shoal train` on this machine: its arguments as a Launch (shoal.launching), run; `server`: the fork server
    its workers fork from (shoal.cluster.node), if any."""
    from shoal.cluster.interface import use_interface
    from shoal.cluster.node.rendezvous import Nodes
    from shoal.launching import Launch, job_to_run, resolve_job

    job = job_to_run(args.job, args.resume, args.overrides, args.trust_code)
    if args.max_restarts < 0:
        raise ShoalError(f"--max-restarts: must be >= 0, got {args.max_restarts}")
    if args.hosts or args.hostfile or (job.cluster.hosts and not args.stop_when_input_closes
                                       and args.nnodes in (None, "1")):
        if server is not None:  # the hosts run the workers
            server.close()
        return command_train_hosts(args, job)
    minimum, maximum = machines(args, job)
    job = resolve_job(job, [], workers_for(args.workers, job, maximum))
    nodes = Nodes(count=maximum, minimum=minimum, rank=args.node_rank, endpoint=args.rdzv_endpoint,
                  secret=node_secret(args), insecure=args.insecure)
    launch = Launch.create(job, args.resume or args.run_dir, nodes, resume=args.resume is not None,
                           max_restarts=args.max_restarts, server=server)
    if args.interface:
        use_interface(args.interface)  # the workers inherit it
    return run_launch(launch)


def run_launch(launch) -> int:
    """Run `launch` (shoal.launching.Launch) and tell how it ended: its final metrics and run directory, or
    how to go on after an interruption."""
    from shoal.cluster.signals import Interrupted
    from shoal.launching import final_metrics

    run_dir = launch.run_dir
    try:
        launch.run()
    except Interrupted as interrupt:
        if getattr(interrupt, "job_goes_on", False):  # one machine of a job of changing machines left it
            print(f"shoal: {interrupt}; the job goes on without this machine: the same command again joins it",
                  file=sys.stderr)
        else:
            print(f"shoal: {interrupt}; continue with: shoal train --resume {run_dir}{trust_flag(launch.job)}",
                  file=sys.stderr)
        return interrupt.exit_code
    if (run_dir / "model.pt").exists():  # this node ran the coordinator
        metrics = final_metrics(run_dir)
        if metrics:  # a job without a test set has none
            print("final " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
    print(f"run directory: {run_dir}")
    return 0


def machines(args: argparse.Namespace, job) -> tuple[int, int]:
    """(MIN, MAX) machines: --nnodes, else the job's cluster.nodes; the job records what was given."""
    from shoal.config import node_range

    if args.nnodes is None:
        return node_range(job.cluster.nodes, "cluster.nodes")
    minimum, maximum = node_range(args.nnodes, "--nnodes")
    if minimum < maximum:  # a resume goes on as a job of changing machines (a fixed count is given again)
        job.cluster.nodes = f"{minimum}:{maximum}"
    return minimum, maximum


def node_secret(args: argparse.Namespace) -> str | None:
    """The job's secret: --secret-file's, the one a --hosts head sends on this node's input, --rdzv-id, or
    SHOAL_JOB_SECRET from the environment; one given by hand must be long enough not to be guessed."""
    from shoal.cluster.node.rendezvous import check_strength, read_secret
    from shoal.cluster.store import SECRET_VARIABLE

    if args.secret_file is not None and args.rdzv_id is not None:
        raise ShoalError("--secret-file and --rdzv-id: give one of them (either is the job's secret)")
    if args.secret_file is not None:
        return read_secret(args.secret_file)
    if args.stop_when_input_closes:
        from shoal.cluster.remote import stop_when_input_closes

        handed = stop_when_input_closes()  # a --hosts head's, random
        if handed:
            return handed
    if args.rdzv_id is not None:
        return check_strength(args.rdzv_id, "--rdzv-id")
    if os.environ.get(SECRET_VARIABLE):
        return check_strength(os.environ[SECRET_VARIABLE], SECRET_VARIABLE)
    return None


def trust_flag(job, hosts: bool = False) -> str:
    """What a resume of this job needs: a job that names code (a model.factory or model.object, or the user's
    loss, step, transform, scheduler factory or metrics) or the MLflow logger is refused without --trust-code,
    and so is, started on `hosts`, one whose cluster.remote is not ssh's."""
    from shoal.code import job_code, job_destinations
    from shoal.config import ClusterConfig

    remote = hosts and job.cluster.remote != ClusterConfig.remote
    code = job.model.factory or job.model.object or job_code(job) or job_destinations(job)
    return " --trust-code" if code or remote else ""


def workers_for(option: str | None, job, nodes: int) -> int | None:
    """--workers as a count: given, or with `auto` what this machine holds (said on stderr; each machine of
    several answers for itself)."""
    if option != "auto":
        if option is not None and not option.lstrip("-").isdigit():
            raise ShoalError(f"--workers: must be an integer >= 1 or auto, got {option}")
        return None if option is None else int(option)  # resolve_job checks the range
    from shoal.train.capacity import auto_workers

    count, reason = auto_workers(job, nodes)
    print(f"shoal: --workers auto: {reason}", file=sys.stderr)
    return count


def command_train_hosts(args: argparse.Namespace, job) -> int:
    """--hosts, --hostfile or cluster.hosts: start every host's node from here (shoal.cluster.remote)."""
    import secrets

    from shoal.cluster.remote import Fleet, agree_workers, node_commands, parse_hosts, read_hostfile
    from shoal.cluster.signals import Interrupted
    from shoal.launching import check_trusted_hosts, new_run_directory, resolve_job

    if args.nnodes not in (None, "1") or args.node_rank is not None or args.rdzv_endpoint or args.interface:
        raise ShoalError("--hosts: the nodes' ranks, meeting place and interfaces are chosen for them; leave out "
                         "--nnodes, --node-rank, --rdzv-endpoint and --interface")
    if args.hosts and args.hostfile:
        raise ShoalError("--hosts and --hostfile: give one of them")
    if args.job is None:  # the run directory's job.toml: its hosts and remote command are data too
        check_trusted_hosts(job, args.resume, args.overrides, args.trust_code,
                            hosts_given=bool(args.hosts or args.hostfile))
    if args.hostfile:
        hosts = read_hostfile(args.hostfile)
    else:
        hosts = parse_hosts(args.hosts.split(",") if args.hosts else job.cluster.hosts,
                            "--hosts" if args.hosts else "cluster.hosts")
    if args.resume is not None:
        run_dir = args.resume.resolve()
        arguments = [*([str(args.job.resolve())] if args.job else []), "--resume", str(run_dir),
                     *(["--trust-code"] if args.trust_code else [])]
    else:
        run_dir = new_run_directory(job, args.run_dir).resolve()  # the same absolute path on every host
        arguments = [str(args.job.resolve()), "--run-dir", str(run_dir)]
    for override in args.overrides:
        arguments += ["--set", override]
    arguments += ["--max-restarts", str(args.max_restarts)]
    if args.workers not in (None, "auto"):
        resolve_job(job, [], workers_for(args.workers, job, 1))  # the count's errors, here and not on every host
    job_file = str(args.job.resolve()) if args.job else str(run_dir / "job.toml")
    counts = agree_workers(hosts, args.workers or str(job.cluster.workers), job.cluster.remote, job_file,
                           args.overrides)  # each host its own
    commands = node_commands(hosts, arguments, counts, job.cluster.port)
    try:  # the nodes get the job's secret on their input, not on a command line others may read
        status = Fleet(hosts, commands, job.cluster.remote, secret=secrets.token_hex(16)).run()
    except Interrupted as interrupt:
        # the run's job.toml holds one count: hosts that ran different ones are told theirs again
        again = [host.name if len(set(counts)) == 1 else f"{host.name}:{count}" for host, count in zip(hosts, counts)]
        print(f"shoal: {interrupt} (every host stopped); continue with: shoal train --resume {run_dir} "
              f"--hosts {','.join(again)}{trust_flag(job, hosts=True)}", file=sys.stderr)
        return interrupt.exit_code
    return status


def comma_list(text: str) -> list[str]:
    """`a, b,c` -> ['a', 'b', 'c'], for options that take a list."""
    return [item.strip() for item in text.split(",")]


class ImportFormats:
    """`--format`'s choices: the importers' table, read only when argparse checks or shows them.

    Importing the importers loads NumPy and Arrow, which `shoal --help` need not wait for.
    """

    def __iter__(self) -> Iterator[str]:
        from shoal.data.importers import FORMATS

        return iter(FORMATS)

    def __contains__(self, name: object) -> bool:
        return name in tuple(self)


def command_import(args: argparse.Namespace) -> int:
    from shoal.data.importers import import_dataset

    dataset = import_dataset(args.source, args.out, args.format, n_features=args.n_features, label=args.label,
                             features=args.features, categorical=args.categorical, encoding_from=args.encoding_from,
                             classes=args.classes, rows_per_file=args.rows_per_file, overwrite=args.force,
                             unlabeled=args.unlabeled, size=args.size, color=args.color)
    classes = dataset.classes if dataset.labeled else "none (unlabeled)"
    print(f"{args.out}: {dataset.rows:,} rows, sample shape {list(dataset.shape)}, classes {classes}")
    return 0


def command_synth(args: argparse.Namespace) -> int:
    from shoal.data import synthetic

    if args.rows < 1:
        raise ShoalError(f"--rows: must be at least 1, got {args.rows}")
    if args.features is not None and args.kind not in ("binary", "sequences"):
        raise ShoalError(f"--features {args.features}: only binary and sequences rows have a feature count to set")
    if args.length is not None and args.kind != "sequences":
        raise ShoalError(f"--length {args.length}: only sequences rows have a length")
    if args.kind == "binary":
        features = 32 if args.features is None else args.features
        dataset = synthetic.synth_binary(args.out, args.rows, features=features, seed=args.seed,
                                         task_seed=args.task_seed, overwrite=args.force)
    elif args.kind == "sequences":
        from shoal.data.sequences import synth_sequences

        features, length = (4 if args.features is None else args.features), (20 if args.length is None else args.length)
        dataset = synth_sequences(args.out, args.rows, length=length, features=features, seed=args.seed,
                                  task_seed=args.task_seed, overwrite=args.force)
    elif args.kind == "claims":
        from shoal.data import claims

        rate = claims.POSITIVES_PER_MILLION if args.positives_per_million is None else args.positives_per_million
        dataset = claims.synth_claims(args.out, args.rows, seed=args.seed, task_seed=args.task_seed,
                                      positives_per_million=rate, overwrite=args.force)
    else:
        dataset = synthetic.synth_digits(args.out, args.rows, seed=args.seed, task_seed=args.task_seed,
                                         overwrite=args.force)
    classes = dataset.classes if dataset.labeled else "none (unlabeled)"
    print(f"{args.out}: {dataset.rows:,} rows, sample shape {list(dataset.shape)}, classes {classes}")
    return 0


def command_describe(args: argparse.Namespace) -> int:
    import json

    from shoal.data.describe import describe, render

    description = describe(args.dataset)
    print(json.dumps(description, indent=1, default=str) if args.json else render(description))
    return 0


def command_split(args: argparse.Namespace) -> int:
    from shoal.data.derive import parse_fraction, split

    test = parse_fraction(args.test, f"{args.dataset}: --test")
    for dataset in split(args.dataset, test=test, stratify=args.stratify, seed=args.seed, train_out=args.out_train,
                         test_out=args.out_test):
        print(f"{dataset.path}: {dataset.rows:,} rows")
    return 0


def command_sample(args: argparse.Namespace) -> int:
    from shoal.data.derive import parse_ratio, sample, subset

    if args.rows is not None:
        if args.minority is not None:
            raise ShoalError("--minority: only with --ratio (--rows keeps every class's proportion)")
        dataset = subset(args.dataset, args.out, rows=args.rows, seed=args.seed)
        print(f"{args.out}: {dataset.rows:,} rows drawn at random, each class in proportion")
        return 0
    ratio = parse_ratio(args.ratio, f"{args.dataset}: --ratio")
    dataset = sample(args.dataset, args.out, ratio=ratio, seed=args.seed, minority=args.minority)
    how = dataset.meta["derived"][-1]
    print(f"{args.out}: {dataset.rows:,} rows: {how['minority_rows']:,} of class {how['minority']!r} and "
          f"{how['majority_rows']:,} of the others (ratio {how['ratio']})")
    return 0


def command_predict(args: argparse.Namespace) -> int:
    from shoal.inference.predictions import predict

    rows = predict(args.run_dir, args.dataset, args.out, overwrite=args.overwrite, trust_code=args.trust_code,
                   workers=args.workers, memory=args.memory)
    print(f"{args.out}: {rows:,} predictions")
    return 0


def command_export(args: argparse.Namespace) -> int:
    from shoal.inference.export import export

    out = export(args.run_dir, args.format, args.out, overwrite=args.overwrite, trust_code=args.trust_code)
    print(f"{out}: the model as {args.format}")
    return 0


def command_status(args: argparse.Namespace) -> int:
    from shoal.run.status import render, summarize, watch

    if args.watch is None:
        print(render(summarize(args.run_dir)))
    else:
        watch(args.run_dir, args.watch)
    return 0


def command_algorithms(args: argparse.Namespace) -> int:
    from shoal.algorithms import catalogue

    rows = [(name + (f" ({variant})" if variant else ""), summary) for name, variant, summary in catalogue()]
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}")
    return 0


def command_report(args: argparse.Namespace) -> int:
    from shoal.run.report import write_report

    print(write_report(args.run_dir))
    return 0


def command_scaling(args: argparse.Namespace) -> int:
    from shoal.api import resolve_job
    from shoal.bench.grid import parse_ratios, parse_rows, parse_workers
    from shoal.bench.report import write_report
    from shoal.bench.study import run_study
    from shoal.cluster.signals import Interrupted

    job = resolve_job(args.job, args.overrides)
    profile = plan_profile(args.profile)  # a bad one is refused now, not after the study
    rows = parse_rows(args.sizes) if args.sizes is not None else None
    ratios = parse_ratios(args.ratios) if args.ratios is not None else None
    hosts = nodes = None
    if args.hosts:
        from shoal.cluster.remote import parse_hosts

        hosts = parse_hosts(args.hosts.split(","), "--hosts")
        nodes = parse_workers(args.nodes, "--nodes") if args.nodes else None
    elif args.nodes:
        raise ShoalError("--nodes: only with --hosts (the machines to run on)")
    try:
        run_study(job, args.out, rows=rows, ratios=ratios, workers=parse_workers(args.workers), trials=args.trials,
                  seed=args.seed, progress=not args.no_progress, hosts=hosts, nodes=nodes)
    except Interrupted as interrupt:
        print(f"shoal: {interrupt}; the finished trials are in {args.out}/trials.csv: run the same command "
              "to go on", file=sys.stderr)
        return interrupt.exit_code
    print(f"report: {write_report(args.out, args.measure, args.alpha, profile)}")
    return 0


def command_scaling_report(args: argparse.Namespace) -> int:
    from shoal.bench.report import write_report

    print(write_report(args.out, args.measure, args.alpha, plan_profile(args.profile)))
    return 0


def plan_profile(path: Path | None):
    """`--profile` of a study: a profile saved by shoal plan, read whole (a bad file is one line, exit 2)."""
    if path is None:
        return None
    from shoal.plan.profile import load_profile

    return load_profile(path)


def command_plan(args: argparse.Namespace) -> int:
    import json

    from shoal.api import resolve_job
    from shoal.plan.command import plan_job

    job = resolve_job(args.job, args.overrides)
    plan, text = plan_job(job, args)
    print(json.dumps(plan.to_dict(), indent=1) if args.json else text)
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="shoal", description=DESCRIPTION)
    root.add_argument("--version", action="version", version=f"shoal {installed_version()}")
    commands = root.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a job on N local workers (or one node of a cluster)")
    train.add_argument("job", nargs="?", type=Path, help="the job file (TOML); with --resume, the run's own")
    train.add_argument("--workers", metavar="N|auto",
                       help="worker processes on this machine (cluster.workers; machines may run different "
                            "counts); auto: as many as its cores and memory hold")
    train.add_argument("--run-dir", type=Path, help="where the job writes (default runs/<job>-<date>-<time>)")
    train.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    train.add_argument("--trust-code", action="store_true",
                       help="with --resume: run the code the run's job.toml names (a model.factory or model.object, "
                            "a train.loss, train.step, data.transform, scheduler factory or metric function: "
                            "loading it runs code from the run directory)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="restart failed workers from the newest checkpoint up to this many times")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a job key, e.g. --set train.epochs=3 (repeatable)")
    cluster = train.add_argument_group("multi-machine (torchrun's arguments)")
    cluster.add_argument("--nnodes", metavar="N|MIN:MAX", help="machines in the job (default cluster.nodes, 1); "
                         "MIN:MAX: the job goes on while MIN remain and takes machines that join, up to MAX")
    cluster.add_argument("--node-rank", type=int,
                         help="this machine's rank (default: 0 on the endpoint's machine, others in order of arrival)")
    cluster.add_argument("--rdzv-endpoint", help="HOST:PORT on the first machine, where the machines meet "
                         "(on a trusted network)")
    cluster.add_argument("--secret-file", type=Path, metavar="FILE",
                         help="the job's secret, the same on every machine and known to nobody else, read from FILE "
                         "(readable by its owner only; make one: openssl rand -hex 16 > FILE); or SHOAL_JOB_SECRET "
                         "in the environment. A job of several machines started by hand needs one")
    cluster.add_argument("--rdzv-id", help="the job's secret on the command line, where every user of the machine "
                         "sees it (ps): prefer --secret-file or SHOAL_JOB_SECRET")
    cluster.add_argument("--insecure", action="store_true",
                         help="machines started by hand meet without a secret: only where nobody else can reach the "
                         "job's ports (anyone who can may read, steer and join the job)")
    cluster.add_argument("--interface", metavar="NAME",
                         help="network interface the workers talk on (default: the one that reaches the endpoint)")
    hosts = train.add_argument_group("one terminal for every machine (each reached by cluster.remote, ssh {host})")
    hosts.add_argument("--hosts", metavar="HOST[:N],...", help="start a node on each host (N workers, a count or "
                       "auto for each host, else --workers; the first host is where they meet), e.g. node1:4,node2:2")
    hosts.add_argument("--hostfile", type=Path, help="the hosts, one per line: HOST, HOST:N or HOST slots=N")
    hosts.add_argument("--stop-when-input-closes", action="store_true", help=argparse.SUPPRESS)
    train.set_defaults(handler=command_train)

    data = commands.add_parser("data", help="datasets: import, synthesize, describe, split, sample")
    data = data.add_subparsers(dest="data_command", required=True)
    importer = data.add_parser("import", help="convert a file (or several) into a shoal dataset folder")
    importer.add_argument("source", nargs="+",
                          help="the input file (images: a folder of one subfolder per class); several files or "
                               "glob patterns ('day-*.csv') are imported into one dataset, in the order given")
    importer.add_argument("out", help="the dataset folder to create")
    # With a metavar, argparse reads the choices only to check a value or to print help (%(choices)s).
    importer.add_argument("--format", required=True, choices=ImportFormats(), metavar="FORMAT",
                          help="the source's format: %(choices)s")
    importer.add_argument("--n-features", type=int, help="feature count (LIBSVM files may not show the last ones)")
    importer.add_argument("--label", help="csv, parquet: the label column, name or 0-based index (default: the last); "
                          "npy, idx: the labels file; hdf5: the labels dataset (default y or label)")
    importer.add_argument("--features", metavar="NAME", help="hdf5: the features dataset (default x or features)")
    importer.add_argument("--unlabeled", action="store_true",
                          help="npy, csv, parquet: features alone, rows to predict (shoal predict), not to train "
                          "on; tables: every column a feature (--encoding-from: its label column left out)")
    importer.add_argument("--categorical", type=comma_list, metavar="COL[,COL...]",
                          help="csv, parquet: text columns to one-hot encode, names or 0-based indices")
    importer.add_argument("--encoding-from", metavar="DATASET_DIR",
                          help="csv, parquet: encode as this dataset was (same columns, categories, order)")
    importer.add_argument("--classes", type=comma_list, metavar="LABEL[,LABEL...]",
                          help="the allowed labels: a row with any other label fails the import")
    importer.add_argument("--size", metavar="HxW", help="images: resize every image to H by W pixels "
                          "(needed when their sizes differ)")
    importer.add_argument("--color", choices=["grey", "rgb"], help="images: store 1 grey or 3 RGB channels "
                          "(default: rgb if any image is stored in colour, else grey)")
    importer.add_argument("--rows-per-file", type=int, default=1_000_000, help="rows per Parquet file")
    importer.add_argument("--force", action="store_true", help="replace an existing output folder")
    importer.set_defaults(handler=command_import)

    synth = data.add_parser("synth", help="generate a synthetic dataset")
    synth.add_argument("kind", choices=["binary", "digits", "claims", "sequences"],
                       help="binary: a learnable two-class task; digits: MNIST-shaped 28x28 images; "
                            "claims: Medicare Part B-like provider rows with rare fraud labels; sequences: "
                            "(length, features) rows of 3 classes told apart by which pulse comes first "
                            "(mpi_learn's LSTM task)")
    synth.add_argument("--rows", type=int, required=True)
    synth.add_argument("--out", required=True, help="the dataset folder to create")
    synth.add_argument("--features", type=int, help="binary: features (default 32); sequences: channels per step "
                                                    "(default 4)")
    synth.add_argument("--length", type=int, help="sequences only: steps per row (default 20)")
    synth.add_argument("--seed", type=int, default=0, help="draws the rows")
    synth.add_argument("--task-seed", type=int, default=0, help="fixes the task: train and test sets share it")
    synth.add_argument("--positives-per-million", type=float, metavar="P",
                       help="claims only: positive rows per million (default 424.2, the study's 1,400 in 3.3 million)")
    synth.add_argument("--force", action="store_true", help="replace an existing output folder")
    synth.set_defaults(handler=command_synth)

    describe = data.add_parser("describe", help="rows, shape, classes and their counts, files and bytes of a dataset")
    describe.add_argument("dataset", help="a dataset folder (local path or URI)")
    describe.add_argument("--json", action="store_true", help="print everything as JSON")
    describe.set_defaults(handler=command_describe)

    split = data.add_parser("split", help="split a dataset at random into a training and a test set")
    split.add_argument("dataset", help="a dataset folder (local path or URI)")
    split.add_argument("--test", required=True, metavar="FRACTION", help="share of the rows in the test set, e.g. 0.2")
    split.add_argument("--stratify", action="store_true", help="keep each class's proportion on both sides")
    split.add_argument("--seed", type=int, default=0, help="draws the split")
    split.add_argument("--out-train", help="the training set folder to create (default DATASET-train)")
    split.add_argument("--out-test", help="the test set folder to create (default DATASET-test)")
    split.set_defaults(handler=command_split)

    sample = data.add_parser("sample", help="under-sample the majority to a minority:majority ratio, "
                             "or draw a random subset of N rows")
    sample.add_argument("dataset", help="a dataset folder (local path or URI)")
    how = sample.add_mutually_exclusive_group(required=True)
    how.add_argument("--ratio", metavar="MINORITY:MAJORITY",
                     help="e.g. 1:25 keeps every minority row and 25 majority rows for each")
    how.add_argument("--rows", type=int, metavar="N", help="N rows at random, each class keeping its proportion")
    sample.add_argument("--out", required=True, help="the dataset folder to create")
    sample.add_argument("--seed", type=int, default=0, help="draws the majority rows")
    sample.add_argument("--minority", metavar="LABEL", help="the minority class (default: the class with fewest rows)")
    sample.set_defaults(handler=command_sample)

    predict = commands.add_parser("predict", help="predict a dataset with a trained run's model")
    predict.add_argument("run_dir", help="a finished run directory")
    predict.add_argument("dataset", help="a dataset folder")
    predict.add_argument("--out", required=True, help="output file (.parquet or .csv), outside the run directory")
    predict.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    predict.add_argument("--workers", type=int, default=1, help="processes sharing the rows (default 1)")
    predict.add_argument("--memory", metavar="SIZE", help="what each process holds at once, like 256MB "
                                                          "(the rows are read a batch at a time)")
    predict.add_argument("--trust-code", action="store_true",
                         help="build the model even if it is made by a model.factory or sent as a model.object "
                              "(loading it runs code named in the run directory)")
    predict.set_defaults(handler=command_predict)

    export = commands.add_parser("export", help="write a trained run's model as TorchScript, ONNX or safetensors")
    export.add_argument("run_dir", help="a finished run directory")
    export.add_argument("--format", required=True, help="torchscript, onnx (pip install 'shoal[onnx]') or "
                                                         "safetensors (pip install 'shoal[safetensors]')")
    export.add_argument("--out", help="the file to write, outside the run directory (default: the run's name "
                                      "and the format's extension, here)")
    export.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    export.add_argument("--trust-code", action="store_true",
                        help="build the model even if it is made by a model.factory or sent as a model.object "
                             "(loading it runs code named in the run directory)")
    export.set_defaults(handler=command_export)

    status = commands.add_parser("status", help="where a job stands: epoch, loss, speed, ETA, workers")
    status.add_argument("run_dir", help="a run directory (running or finished)")
    status.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until the job ends or Ctrl-C")
    status.set_defaults(handler=command_status)

    bench = commands.add_parser("bench", help="scaling studies: training time against dataset size and workers")
    bench = bench.add_subparsers(dest="bench_command", required=True)
    scaling = bench.add_parser("scaling", help="train a job on a grid of dataset sizes x worker counts x trials, "
                               "then write ANOVA and Tukey tables and plots")
    scaling.add_argument("job", type=Path, help="the job file (TOML); its data.train is the largest dataset")
    sizes = scaling.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--sizes", metavar="ROWS[,ROWS...]", help="row counts drawn at random from data.train, "
                       "like 2240,22400,2.2M")
    sizes.add_argument("--ratios", metavar="1:R[,1:R...]", help="under-sample data.train to these "
                       "minority:majority ratios, like 1:1,1:5,1:2000")
    scaling.add_argument("--workers", required=True, metavar="N[,N...]", help="worker counts, like 1,2,4,8 "
                         "(per host with --hosts)")
    scaling.add_argument("--hosts", metavar="HOST[,HOST...]", help="run each trial on the first N of these machines "
                         "(reached by cluster.remote, ssh {host}; the study folder shared by all)")
    scaling.add_argument("--nodes", metavar="N[,N...]", help="with --hosts: the host counts to study (default 1 "
                         "to all of them)")
    scaling.add_argument("--trials", type=int, default=20, help="trials per size and worker count (default 20)")
    scaling.add_argument("--out", type=Path, required=True, help="the study folder; rerun to resume or extend")
    scaling.add_argument("--seed", type=int, default=0, help="draws the datasets and the order of the trials")
    scaling.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a job key for every trial (repeatable)")
    scaling.add_argument("--no-progress", action="store_true", help="no progress bar")
    for command in (scaling, bench.add_parser("report", help="remake a study's report.md, tables and plots")):
        if command is not scaling:
            command.add_argument("out", type=Path, help="the study folder")
        command.add_argument("--measure", default="train_seconds", choices=["train_seconds", "job_seconds",
                             "wall_seconds"], help="the time the statistics compare (default train_seconds)")
        command.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
        command.add_argument("--profile", type=Path, help="a profile saved by shoal plan: the report sets the "
                             "plan's prediction beside each measured cell")
        command.set_defaults(handler=command_scaling if command is scaling else command_scaling_report)

    add_plan_parser(commands)

    algorithms = commands.add_parser("algorithms", help="the algorithms a job can name (algorithm.name)")
    algorithms.set_defaults(handler=command_algorithms)

    report = commands.add_parser("report", help="write RUN_DIR/report.md with plots of loss, time split, workers")
    report.add_argument("run_dir", help="a run directory")
    report.set_defaults(handler=command_report)
    return root


def add_plan_parser(commands) -> None:
    plan = commands.add_parser("plan", help="predict epoch time, job time and speedup per cluster size and algorithm")
    plan.add_argument("job", type=Path, help="the job file (TOML)")
    where = plan.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="HOST[,HOST...]", help="the machines: the network is measured between the "
                       "first two (reached by cluster.remote, ssh {host}); plans 1 to all of them")
    where.add_argument("--nodes", metavar="N[,N...]", help="node counts to plan (default 1,2,4,8,16)")
    plan.add_argument("--workers-per-node", type=int, default=1, metavar="K", help="workers on each machine")
    plan.add_argument("--machines", metavar="CLASS[,CLASS...]",
                      help="machines of different speeds, in rank order (N nodes are the first N; with --hosts, one "
                      "for each host): COUNTxSPEED, machines whose workers step SPEED times as fast as the profile's "
                      "machine (2x1.0,1x0.5), or COUNTxPROFILE, a profile saved on such a machine by --save-profile "
                      "(2xfast.json,1xslow.json); each algorithm is then predicted with equal shares and with speed "
                      "shares (cluster.balance = \"speed\")")
    plan.add_argument("--link", metavar="RATE", help="describe the network instead of measuring it, like 1gbit, "
                      "100mbit (default without --hosts or --profile: 1gbit)")
    plan.add_argument("--latency", metavar="TIME", help="with --link: each message's fixed cost, like 0.1ms "
                      "(default: the --profile's probed one, else 0.1ms)")
    plan.add_argument("--rows", type=int, help="plan for this many training rows instead of data.train's")
    plan.add_argument("--algorithms", metavar="NAME[,NAME...]",
                      help="algorithms to compare (default: the job's, sync, averaging, downpour)")
    plan.add_argument("--profile", type=Path, action="append", help="reuse a saved profile: its network, and its "
                      "compute for the same model (leave it out to measure again); repeated, each number is the "
                      "median of the profiles' (calibrations taken at different times, so one slow moment counts once)")
    plan.add_argument("--save-profile", type=Path, metavar="PATH", help="write the measured profile here")
    plan.add_argument("--plot", type=Path, metavar="PNG", help="write the predicted curves to this image")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a job key (repeatable)")
    plan.set_defaults(handler=command_plan)


def installed_version() -> str:
    """The installed package's version (its metadata, as pip shows it); the source's own in a bare checkout."""
    from importlib import metadata

    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        from shoal import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    quiet_torch()
    args = parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ShoalError, WorkerError) as error:  # the user's input, or a job that failed: one line
        print(f"shoal: error: {error}", file=sys.stderr)
        return getattr(error, "exit_code", EXIT_USAGE)
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130


def quiet_torch(environment: dict = os.environ) -> None:
    """torch's C++ warnings (a c10d store line per connection on a cluster) stay out of the user's terminal;
    errors still show, and TORCH_CPP_LOG_LEVEL or SHOAL_DEBUG_LAUNCH bring the rest back. Set before torch
    loads, and inherited by the workers."""
    if not environment.get("SHOAL_DEBUG_LAUNCH"):
        environment.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def run() -> None:
    """The `shoal` command's entry point: `main`, then a quick exit (see shoal.process)."""
    from shoal.process import end_process

    end_process(main())


if __name__ == "__main__":
    run()
