"""Run directories are data, through `shoal train` in this process: it starts shoal's fork server (or a host's
remote command) before it refuses a factory, a remote command, hosts or an MLflow server found in a run's
job.toml, or a failing factory, in one line (what needs no process: tests/unit/test_trust.py)."""

from __future__ import annotations

import sys

import pytest

import shoal
from shoal.cli import main
from shoal.errors import ConfigError
from tests.unit.test_trust import (
    sent_line,
    server_uri,
    tracking_server,  # noqa: F401 (a fixture)
    untrusted_line,
    write_dataset,
    write_logged_run,
    write_remote_run,
    write_resumable,
)

pytestmark = pytest.mark.usefixtures("quiet_environment")


def test_resume_refuses_a_factory_from_the_run_directory(tmp_path, capsys):
    marker = tmp_path / "ran"
    run_dir = write_resumable(tmp_path, marker)
    with pytest.raises(ConfigError) as caught:
        shoal.resume(run_dir)
    assert str(caught.value) == untrusted_line(run_dir / "job.toml", "os:system")
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"shoal: error: {untrusted_line(run_dir / 'job.toml', 'os:system')}\n"
    assert not marker.exists()
    assert sorted(path.name for path in run_dir.iterdir()) == ["job.toml"]


def test_trust_code_is_only_for_resume(tmp_path, capsys):
    assert main(["train", str(tmp_path / "job.toml"), "--trust-code"]) == 2
    assert capsys.readouterr().err == ("shoal: error: --trust-code: only with --resume RUN_DIR "
                                       "(a job file you name is trusted as it is)\n")


def test_the_launcher_reports_a_failing_factory_in_one_line(tmp_path, factories, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # whatever the launcher's checks import, later tests start clean
    train = write_dataset(tmp_path / "train")
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nfactory = "{factories}:broken"\narguments = {{ features = 3 }}\n'
                   f'[data]\ntrain = "{train}"\n')
    assert main(["train", str(job), "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"shoal: error: model.factory: '{factories}:broken' failed: ValueError: " \
                                      "no width fits\n"
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_remote_command_from_the_run_directory(tmp_path, capsys):
    marker = tmp_path / "PWNFILE"
    run_dir = write_remote_run(tmp_path, marker)
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shoal: error: {run_dir / 'job.toml'}: cluster.remote \"sh -c 'touch {marker}; echo x' "
                          "{host}\" would run that command here; pass --trust-code") and err.count("\n") == 1
    assert not marker.exists()


def test_resume_refuses_the_run_directorys_hosts(tmp_path, capsys):
    run_dir = write_remote_run(tmp_path, tmp_path / "ran")
    (run_dir / "job.toml").write_text((run_dir / "job.toml").read_text().replace("remote =", "# remote ="))
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err == (f"shoal: error: {run_dir / 'job.toml'}: cluster.hosts ['localhost'] would "
                                       "start shoal on those hosts through 'ssh {host}'; pass --trust-code if you "
                                       "trust this run directory, or give it again (--hosts)\n")


def test_a_hosts_head_whose_remote_command_started_no_node_fails(tmp_path, capsys):
    marker = tmp_path / "PWNFILE"
    run_dir = write_remote_run(tmp_path, marker)
    assert main(["train", "--resume", str(run_dir), "--trust-code"]) == 2  # trusted: it runs, and trains nothing
    err = capsys.readouterr().err
    assert err == (f"shoal: error: localhost: never started its node: \"sh -c 'touch {marker}; echo x' {{host}}\" "
                   "ended without running shoal there\n")
    assert marker.exists()


def test_resume_of_a_copied_run_without_its_pickle_stops_before_any_worker(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train = write_dataset(tmp_path / "train")
    (run_dir / "job.toml").write_text(f'[model]\nobject = "model.object.pkl"\n[data]\ntrain = "{train}"\n')
    assert main(["train", "--resume", str(run_dir), "--trust-code"]) == 2
    assert capsys.readouterr().err == (f"shoal: error: model.object: {run_dir / 'model.object.pkl'}: no such file "
                                       "in the run directory\n")


def test_resume_refuses_the_mlflow_server_a_run_directory_names_and_sends_nothing(
        tmp_path, capsys, tracking_server):  # noqa: F811
    uri = server_uri(tracking_server)
    where = f"at {uri!r}"
    run_dir = write_logged_run(tmp_path, f'loggers = ["mlflow"]\nmlflow_uri = "{uri}"')
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"shoal: error: {sent_line(run_dir, 'output.loggers', ['mlflow'], where)}\n"
    assert main(["train", "--resume", str(run_dir), "--set", 'output.loggers=["mlflow"]']) == 2
    assert capsys.readouterr().err == f"shoal: error: {sent_line(run_dir, 'output.mlflow_uri', uri, where)}\n"
    assert tracking_server.requests == []
    assert sorted(path.name for path in run_dir.iterdir()) == ["job.toml"]
