"""The network probe's two ranks on this machine, over loopback: what it reports and how a plan reads it.

The probe across emulated hosts runs in tests/cluster/test_plan.py, for a collective algorithm (all-reduces
alone); here both patterns run, the point-to-point messages a parameter server's plan needs among them.
"""

from __future__ import annotations

from shoal.plan.calibrate import measured_pair
from shoal.plan.network_probe import links
from tests.distributed.harness import free_port


def test_both_patterns_are_timed_at_every_size_and_give_two_links():
    sizes = [4096, 65536]
    results = measured_pair("localhost", "localhost", None, free_port(), sizes)
    for pattern in ("loaded_all_reduce", "loaded_message"):
        assert sorted(int(size) for size in results[pattern]) == sizes
        assert all(seconds >= 0 for seconds in results[pattern].values())
    assert results["pace"] > 0
    ring, message = links(results)
    assert ring.bandwidth > 0 and message.bandwidth > 0
    assert [size for size, _ in message.points] == sizes  # a message is one round of its whole size
    assert [size for size, _ in ring.points] == [size // 2 for size in sizes]  # a 2-rank ring's chunks


def test_without_messages_the_probe_times_all_reduces_alone():
    results = measured_pair("localhost", "localhost", None, free_port(), [4096, 65536], messages=False)
    assert len(results["loaded_all_reduce"]) == 2 and not results["loaded_message"]
    assert links(results)[1] is None
