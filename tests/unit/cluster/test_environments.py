"""Each launcher's environment on its own: MPI families, SLURM's compressed forms and node lists,
the store's address a SLURM job implies, GPU binding, and torchrun's restart count."""

from __future__ import annotations

import pytest

from shoal.cluster.environments import MPICH, MVAPICH, OpenMPI, Slurm, TorchElastic, detect
from shoal.cluster.environments.base import Place
from shoal.cluster.environments.slurm import PORT_BASE, expand_nodes, expand_tasks
from shoal.errors import ShoalError


def test_nothing_set_is_no_launcher():
    assert detect({}) is None


@pytest.mark.parametrize(("variables", "kind", "place"), [
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, TorchElastic, Place(5, 8, 1, 4)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, OpenMPI, Place(2, 3, 0, 1)),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, MPICH, Place(3, 4, 1, 2)),
    ({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_RANK": "1",
      "MV2_COMM_WORLD_LOCAL_SIZE": "2"}, MVAPICH, Place(1, 2, 1, 2)),
    ({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4"}, Slurm,
     Place(6, 8, 2, 4)),
])
def test_every_launcher_is_read_from_its_own_variables(variables, kind, place):
    environment = detect(variables)
    assert isinstance(environment, kind) and environment.place() == place


def test_mpich_under_an_outer_slurm_allocation_is_numbered_by_mpich():
    variables = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "PMI_RANK": "1", "PMI_SIZE": "2"}
    assert isinstance(detect(variables), MPICH) and detect(variables).place().rank == 1


def test_a_variable_that_is_not_a_number_is_named():
    with pytest.raises(ShoalError, match=r"PMI_SIZE: MPICH set it to 'many', not a number"):
        detect({"PMI_RANK": "0", "PMI_SIZE": "many"}).place()


@pytest.mark.parametrize(("text", "counts"), [
    ("4", [4]), ("4(x2)", [4, 4]), ("4(x2),3", [4, 4, 3]), ("2,1(x3)", [2, 1, 1, 1])])
def test_slurm_tasks_per_node_in_every_form(text, counts):
    assert expand_tasks(text) == counts


def test_unreadable_tasks_per_node_are_named():
    with pytest.raises(ShoalError, match=r"tasks per node: cannot read '4\(y2\)'"):
        expand_tasks("4(y2)")


@pytest.mark.parametrize(("node", "local"), [(0, 4), (1, 4), (2, 3)])
def test_the_local_world_size_is_this_nodes_count(node, local):
    variables = {"SLURM_PROCID": "0", "SLURM_NTASKS": "11", "SLURM_NODEID": str(node),
                 "SLURM_TASKS_PER_NODE": "4(x2),3"}
    assert detect(variables).place().local_world_size == local


def test_the_steps_tasks_per_node_come_before_the_jobs():
    variables = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "8(x2)",
                 "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    assert detect(variables).place().local_world_size == 2


@pytest.mark.parametrize(("text", "hosts"), [
    ("node1", ["node1"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
    ("gpu-[9-10].cluster", ["gpu-9.cluster", "gpu-10.cluster"]),
])
def test_node_lists_expand_as_scontrol_does(text, hosts):
    assert expand_nodes(text) == hosts


def test_a_slurm_job_meets_on_its_first_node_at_a_port_from_its_id():
    variables = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "123456",
                 "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_STEP_NODELIST": "node[08-09]"}
    assert detect(variables).master() == ("node08", PORT_BASE + 123456 % 20000)


def test_master_addr_and_port_given_by_the_user_win():
    variables = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                 "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}
    assert detect(variables).master() == ("10.0.0.9", 29500)


def test_mpi_implies_no_master():
    assert detect({"PMI_RANK": "0", "PMI_SIZE": "2"}).master() is None


def test_one_gpu_per_task_is_known():
    variables = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_GPUS_PER_TASK": "1"}
    assert detect(variables).gpu_per_process() and not detect({"PMI_RANK": "0", "PMI_SIZE": "2"}).gpu_per_process()


def test_restarts_within_a_job_and_requeues_of_it():
    variables = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert detect(variables).max_restarts() == 3 and detect(variables).requeue_count() == 0
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_RESTART_COUNT": "2"}
    assert detect(slurm).requeue_count() == 2 and detect(slurm).max_restarts() == 0
