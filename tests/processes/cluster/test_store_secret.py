"""A host's head hands each node the job's secret on its input, never on its command line: nodes started for
real through a stand-in for ssh (the keys the secret names: tests/unit/cluster/test_store_secret.py)."""

from __future__ import annotations

import sys

from shoal.cluster.remote import Fleet, Host, remote_command
from tests.unit.cluster.test_store_secret import SECRET


def test_a_hosts_head_hands_its_nodes_the_secret_on_their_input(capsys):
    node = [sys.executable, "-c", "import os; from shoal.cluster.remote import stop_when_input_closes as node; "
                                  "print('secret', node(), flush=True); os._exit(0)"]  # as shoal ends
    fleet = Fleet([Host("localhost")], [node], "env SHOAL_TEST_HOST={host} sh -c", secret=SECRET)
    assert fleet.run() == 0
    assert f"[localhost] secret {SECRET}" in capsys.readouterr().out.splitlines()
    assert not any(SECRET in word for word in remote_command(fleet.template, "localhost", node))
