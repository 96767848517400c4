"""Which group carries the parameter servers' messages: the default group under gloo, a gloo group
beside it under any other backend (NCCL cannot receive from any source).

A backend other than gloo is played by torch's "fake" process group, so the choice is checked
without CUDA; each test joins a one-process group in this process and leaves it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from shoal.cluster.collectives import message_group, open_message_group
from shoal.errors import ShoalError


def join(backend: str) -> None:
    if backend == "fake":
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))


@pytest.fixture
def leave():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_without_a_process_group_messages_name_the_default_group():
    assert not dist.is_initialized()
    assert message_group() is None


def test_under_gloo_messages_go_over_the_default_group(leave):
    join("gloo")
    assert open_message_group() is None
    assert message_group() is None
    assert dist.get_pg_count() == 1  # no second group made


def test_under_another_backend_messages_go_over_a_gloo_group_made_once(leave):
    join("fake")
    group = open_message_group(timedelta(seconds=30))
    assert group is not None and dist.get_backend(group) == "gloo"
    assert dist.get_process_group_ranks(group) == [0]
    assert open_message_group() is group  # once per default group: a second call makes none
    assert message_group() is group


def test_under_another_backend_messages_without_a_gloo_group_are_refused(leave):
    join("fake")
    with pytest.raises(ShoalError, match=r"^point-to-point messages under fake need a gloo group: call "
                                         r"shoal\.cluster\.collectives\.open_message_group\(\)"):
        message_group()


def test_a_new_default_group_does_not_inherit_the_last_ones_messages_group(leave):
    join("fake")
    assert open_message_group() is not None
    dist.destroy_process_group()
    join("gloo")
    assert message_group() is None


def test_without_a_process_group_no_messages_group_is_made():
    assert open_message_group() is None
    assert not dist.is_initialized()
