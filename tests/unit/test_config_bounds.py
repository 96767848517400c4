"""Values that pass a type check but fail in every worker are refused at load: train.seed,
cluster.timeout, cluster.stall_timeout and cluster.threads have ranges, each error one line naming the key."""

from __future__ import annotations

import textwrap
from datetime import timedelta

import pytest
import torch

from shoal.cluster.heartbeat import HEARTBEAT_SECONDS
from shoal.config import MAX_THREADS, SEED_LIMIT, TIMEOUT_RANGE
from shoal.errors import ConfigError
from shoal.jobs import load_job
from shoal.train.runner import seed_everything

MINIMAL = """
[model]
input = [4]
layers = [{ dense = 2 }]

[data]
train = "/nowhere/train"
"""


def refused(tmp_path, extra: str = "", overrides: tuple[str, ...] = ()) -> str:
    """The message a job with these lines (or overrides) is refused with, after checking it is one line."""
    path = tmp_path / "job.toml"
    path.write_text(MINIMAL + textwrap.dedent(extra))
    with pytest.raises(ConfigError) as caught:
        load_job(path, overrides=overrides)
    message = str(caught.value)
    assert "\n" not in message
    # named as given: the file, or the --set that gave the key
    blamed = f"--set {overrides[-1]!r}: " if overrides else f"{path}: "
    assert message.startswith(blamed)
    return message.removeprefix(blamed)


def loaded(tmp_path, extra: str):
    path = tmp_path / "job.toml"
    path.write_text(MINIMAL + textwrap.dedent(extra))
    return load_job(path)


# ---------------------------------------------------------------- train.seed


@pytest.mark.parametrize("seed", [2**64 - 1, 2**63, -1])
def test_a_seed_out_of_range_is_refused_naming_the_key(tmp_path, seed):
    assert refused(tmp_path, f"\n[train]\nseed = {seed}\n") == (
        f"train.seed: must be an integer from 0 to {SEED_LIMIT - 1}, got {seed}")


def test_a_seed_out_of_range_from_an_override_is_refused(tmp_path):
    message = refused(tmp_path, overrides=(f"train.seed={2**64 - 1}",))
    assert message == f"train.seed: must be an integer from 0 to {SEED_LIMIT - 1}, got {2**64 - 1}"


def test_the_largest_seed_is_accepted_and_seeds_every_rank():
    # what failed in the workers: seed + 1 + rank past torch's limit of 2**64 - 1
    with pytest.raises((RuntimeError, ValueError)):
        torch.manual_seed(2**64 - 1 + 1)
    job_seed = SEED_LIMIT - 1
    for rank in (0, 1, 4095):
        seed_everything(job_seed + 1 + rank)
    seed_everything(job_seed)


def test_the_largest_seed_loads(tmp_path):
    assert loaded(tmp_path, f"\n[train]\nseed = {SEED_LIMIT - 1}\n").train.seed == SEED_LIMIT - 1


# ---------------------------------------------------------------- cluster.timeout


@pytest.mark.parametrize("timeout", ["1e15", "0.0001", "0.5", "604801", "inf", "nan"])
def test_a_timeout_out_of_range_is_refused_naming_the_key(tmp_path, timeout):
    message = refused(tmp_path, f"\n[cluster]\ntimeout = {timeout}\n")
    assert message.startswith("cluster.timeout: must be seconds from 1 to 604800 (a week), got ")


def test_the_huge_timeout_message_is_exact(tmp_path):
    assert refused(tmp_path, "\n[cluster]\ntimeout = 1e15\n") == (
        "cluster.timeout: must be seconds from 1 to 604800 (a week), got 1000000000000000.0")


@pytest.mark.parametrize("timeout", [1, 2.5, 604800])
def test_a_timeout_in_range_loads(tmp_path, timeout):
    assert loaded(tmp_path, f"\n[cluster]\ntimeout = {timeout}\n").cluster.timeout == timeout


def test_the_longest_timeout_fits_what_the_workers_make_of_it():
    low, high = TIMEOUT_RANGE
    assert timedelta(seconds=high).total_seconds() == high
    with pytest.raises(OverflowError):
        timedelta(seconds=1e15)  # what the workers met before the range


# ---------------------------------------------------------------- cluster.stall_timeout


@pytest.mark.parametrize("seconds", ["0", "4.9", "-5", "604801", "inf", "nan"])
def test_a_stall_timeout_out_of_range_is_refused_naming_the_key(tmp_path, seconds):
    message = refused(tmp_path, f"\n[cluster]\nstall_timeout = {seconds}\n")
    assert message.startswith("cluster.stall_timeout: must be seconds from 5 to 604800 (a week), got ")


@pytest.mark.parametrize("seconds", ["true", '"soon"', "[30]"])
def test_a_stall_timeout_that_is_no_number_is_refused_naming_the_key(tmp_path, seconds):
    assert refused(tmp_path, f"\n[cluster]\nstall_timeout = {seconds}\n").startswith("cluster.stall_timeout: ")


def test_the_stall_timeout_is_checked_in_an_override_too(tmp_path):
    assert refused(tmp_path, overrides=("cluster.stall_timeout=1",)) == (
        "cluster.stall_timeout: must be seconds from 5 to 604800 (a week), got 1")


@pytest.mark.parametrize("seconds", [5, 12.5, 604800])
def test_a_stall_timeout_in_range_loads_whatever_the_timeout(tmp_path, seconds):
    cluster = loaded(tmp_path, f"\n[cluster]\nstall_timeout = {seconds}\ntimeout = 1\n").cluster
    assert (cluster.stall_timeout, cluster.timeout) == (seconds, 1)


def test_a_hung_worker_is_named_within_a_minute_by_default(tmp_path):
    """The default leaves room for the beats' own second or two under 60 s (see Heartbeat.stalled)."""
    cluster = loaded(tmp_path, "").cluster
    assert cluster.stall_timeout == 30 and cluster.stall_timeout + 3 * HEARTBEAT_SECONDS < 60
    assert cluster.stall_timeout < cluster.timeout


# ---------------------------------------------------------------- cluster.threads


def test_too_many_threads_are_refused_naming_the_key(tmp_path):
    assert refused(tmp_path, "\n[cluster]\nthreads = 100000000\n") == (
        f"cluster.threads: must be an integer from 0 to {MAX_THREADS}, got 100000000")


def test_too_many_threads_from_an_override_are_refused(tmp_path):
    assert refused(tmp_path, overrides=("cluster.threads=1025",)) == (
        f"cluster.threads: must be an integer from 0 to {MAX_THREADS}, got 1025")


@pytest.mark.parametrize(("value", "shown"), [("1e8", "100000000.0"), ('"many"', "'many'"), ("true", "True")])
def test_threads_that_are_not_an_integer_are_refused_naming_the_key(tmp_path, value, shown):
    assert refused(tmp_path, f"\n[cluster]\nthreads = {value}\n") == f"cluster.threads: expected int, got {shown}"


def test_the_most_threads_load(tmp_path):
    assert loaded(tmp_path, f"\n[cluster]\nthreads = {MAX_THREADS}\n").cluster.threads == MAX_THREADS
