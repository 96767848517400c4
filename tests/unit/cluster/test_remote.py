"""One terminal for every machine: hosts from --hosts, a hostfile or the job, and each node's command (asking
the hosts through a command: tests/processes/cluster/test_remote.py)."""

from __future__ import annotations

import shlex
import sys

import pytest

from shoal.cluster.remote import Host, agree_workers, node_commands, parse_hosts, read_hostfile, remote_command
from shoal.errors import ConfigError


def test_hosts_with_and_without_worker_counts():
    assert parse_hosts(["node1:4", "node2", "10.0.0.3:auto"], "--hosts") == [
        Host("node1", "4"), Host("node2", None), Host("10.0.0.3", "auto")]


@pytest.mark.parametrize("entries", [["node1:0"], ["node1", "node1:2"], ["bad host"], []])
def test_bad_hosts_name_the_option(entries):
    with pytest.raises(ConfigError, match="^--hosts"):
        parse_hosts(entries, "--hosts")


def test_a_hostfile_in_shoals_or_open_mpis_form(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the rack\nnode1 slots=4\nnode2:2   # a smaller one\n\nnode3\n")
    assert read_hostfile(path) == [Host("node1", "4"), Host("node2", "2"), Host("node3", None)]
    path.write_text("node1\nnode one\n")
    with pytest.raises(ConfigError, match=f"^{path}:2: cannot read host"):
        read_hostfile(path)


def test_the_remote_command_is_the_template_and_one_shell_line():
    command = remote_command("ssh -p 2222 {host}", "node2", ["python", "-m", "shoal", "train", "a job.toml"])
    assert command[:3] == ["ssh", "-p", "2222"] and command[3] == "node2"
    assert shlex.split(command[4]) == ["python", "-m", "shoal", "train", "a job.toml"]


def test_every_node_gets_its_rank_its_own_workers_and_the_first_host_as_meeting_place():
    hosts = [Host("node1", "4"), Host("node2", None)]
    first, second = node_commands(hosts, ["/jobs/a.toml", "--run-dir", "/runs/a"], counts=[4, 2], port=29555)
    assert first[:4] == [sys.executable, "-m", "shoal", "train"]
    for rank, (command, workers) in enumerate([(first, "4"), (second, "2")]):
        options = dict(zip(command[5::2], command[6::2]))
        assert options["--workers"] == workers and options["--node-rank"] == str(rank)
        assert options["--nnodes"] == "2" and options["--rdzv-endpoint"] == "node1:29555"
        assert command[-1] == "--stop-when-input-closes"


def test_each_host_runs_its_own_count_or_else_the_commands():
    assert agree_workers([Host("node1", "4"), Host("node2")], "4", "ssh {host}", "job.toml", []) == [4, 4]
    assert agree_workers([Host("node1", "4"), Host("node2", "2")], "1", "ssh {host}", "job.toml", []) == [4, 2]
    assert agree_workers([Host("node1"), Host("node2", "3"), Host("node3")], "2", "ssh {host}", "job.toml",
                         []) == [2, 3, 2]


def test_a_hostfile_with_different_slots_gives_each_host_its_own_workers(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("big slots=4\nsmall:2\nplain\n")
    hosts = read_hostfile(path)
    counts = agree_workers(hosts, "1", "ssh {host}", "job.toml", [])
    assert counts == [4, 2, 1]
    commands = node_commands(hosts, ["/jobs/a.toml"], counts, port=29400)
    assert [command[command.index("--workers") + 1] for command in commands] == ["4", "2", "1"]


def test_a_host_with_no_workers_is_refused_however_spelled():
    for entry in ("node1:0", "node1:00"):
        with pytest.raises(ConfigError, match=f"^--hosts: cannot read host '{entry}'"):
            parse_hosts([entry], "--hosts")
