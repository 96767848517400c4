"""The run in MLflow: the job's settings as params, the run's scalars as metrics, its end as the status.

Written through `MlflowClient` (no global active run: rank 0 may be a notebook's process) to
`output.mlflow_uri` (default file:RUN_DIR/mlruns), in `output.mlflow_experiment` (default the
job's name). The run's id is kept in RUN_DIR/mlflow.json, and a resumed job (or a restarted
attempt) goes on in the same MLflow run when it reaches the same tracking URI: metrics continue
at their steps, params it already has are kept (MLflow's params cannot change; a setting changed
on resumption shows in job.toml and events.jsonl). A job that ends without completing leaves
its run FAILED, until it is resumed. Every epoch has its world size (the `cluster/world_size`
metric); in a job whose machines change, the tag `shoal.machines` says the latest set of machines
and why it changed (a tag, as it changes: a param could not).

Requests give up quickly (MLFLOW_HTTP_REQUEST_MAX_RETRIES, _BACKOFF_FACTOR and _TIMEOUT default to
2, 1 and 10 seconds here, unless set): a tracking server that is down costs the job seconds, then
the logger is off. MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE is true, which
is the default here for a file URI: the default store needs no database package and no server.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from urllib.parse import urlparse

from shoal.durable import write_text_durably
from shoal.events import Event, JobEnd, JobStart, Membership
from shoal.run.status import machines_text
from shoal.safe_files import refuse_links_within
from shoal.train.loggers.scalars import WorldSize, parameters, scalars

RUN_FILE = "mlflow.json"
PATIENCE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
FILE_STORE = {"MLFLOW_ALLOW_FILE_STORE": "true"}
PARAM_LENGTH = 6000  # the longest param value MLflow (2.10 and later) takes
TAG_LENGTH = 5000  # the longest tag value every MLflow since 1.0 takes
MACHINES_TAG = "shoal.machines"


class MlflowLogger:
    def __init__(self, run_dir: Path, uri: str | None, experiment: str):
        self.run_dir = Path(run_dir)
        if uri is None:  # the run directory's own store: MLflow writes its files by name, through any link
            refuse_links_within(self.run_dir / "mlruns")
        self.uri = uri or (self.run_dir / "mlruns").resolve().as_uri()
        file_store = urlparse(self.uri).scheme in ("", "file")
        for name, value in (PATIENCE | (FILE_STORE if file_store else {})).items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id = self.resumed() or self.new_run(experiment)
        self.ended = False
        self.world_size = WorldSize()

    def resumed(self) -> str | None:
        """The id of the run an earlier attempt in this folder logged to, when it is at this URI."""
        path = self.run_dir / RUN_FILE
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        if stored.get("tracking_uri") != self.uri:
            return None
        self.client.update_run(stored["run_id"], status="RUNNING")
        return stored["run_id"]

    def new_run(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name,
                                     tags={"shoal.run_dir": str(self.run_dir.resolve())})
        stored = {"tracking_uri": self.uri, "experiment_id": experiment_id, "run_id": run.info.run_id}
        write_text_durably(self.run_dir / RUN_FILE, json.dumps(stored, indent=2))
        return run.info.run_id

    def write(self, event: Event) -> None:
        self.world_size.follow(event)
        if isinstance(event, JobStart):
            self.log_parameters(event)
        if isinstance(event, Membership):
            self.client.set_tag(self.run_id, MACHINES_TAG,
                                f"attempt {event.attempt}: {machines_text(event)}"[:TAG_LENGTH])
        found = scalars(event, self.world_size.value)
        if found is not None:
            from mlflow.entities import Metric

            stamp = int((found.time or time.time()) * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(name, value, stamp, found.step)
                                                        for name, value in found.values.items()])
        if isinstance(event, JobEnd):
            self.client.set_terminated(self.run_id, "FINISHED" if event.completed else "FAILED")
            self.ended = True

    def log_parameters(self, event: JobStart) -> None:
        """The job's settings, those the run does not have yet (a resumed run keeps its own)."""
        from mlflow.entities import Param

        held = self.client.get_run(self.run_id).data.params
        new = [Param(name, str(value)[:PARAM_LENGTH]) for name, value in parameters(event).items() if name not in held]
        for first in range(0, len(new), 100):  # log_batch takes at most 100 params at once
            self.client.log_batch(self.run_id, params=new[first:first + 100])

    def close(self) -> None:
        if not self.ended:
            self.client.set_terminated(self.run_id, "FAILED")
            self.ended = True
