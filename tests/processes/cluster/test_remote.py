"""Asking every host how many workers it holds, through a stand-in for ssh that runs for real (what starts
no process: tests/unit/cluster/test_remote.py)."""

from __future__ import annotations

from shoal.cluster.remote import Host, agree_workers


def test_auto_asks_every_host_and_each_runs_what_it_holds(tmp_path, capsys):
    answers = tmp_path / "fake-ssh"  # a stand-in for ssh: node1 holds 3 workers, node2 holds 2
    answers.write_text('#!/bin/sh\ncase "$1" in node1) echo "3\tthree";; node2) echo "2\ttwo";; esac\n')
    answers.chmod(0o755)
    hosts = [Host("node1", "auto"), Host("node2"), Host("node3", "4")]
    assert agree_workers(hosts, "auto", f"{answers} {{host}}", "job.toml", []) == [3, 2, 4]
    told = capsys.readouterr().err
    assert "node1: three" in told and "node2: two" in told
    assert "--workers auto: node1 3, node2 2, node3 4 (9 in all)" in told
