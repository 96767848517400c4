"""Job files: TOML in, validated JobConfig out, and every error names the key at fault."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pytest

from shoal.algorithms import REGISTRY
from shoal.config import (
    AlgorithmConfig,
    ClusterConfig,
    JobConfig,
    OutputConfig,
    TrainConfig,
    apply_overrides,
    parse_override,
)
from shoal.data.partition import epoch_order
from shoal.errors import ConfigError, ShoalError
from shoal.jobs import from_dict, load_job

MINIMAL = """
[model]
input = [123]
layers = [{ dense = 100, activation = "relu" }, { dropout = 0.5 }, { dense = 2 }]

[data]
train = "/nowhere/train"
"""

SYNC_DEFAULTS = {"compression": "none", "compression_rank": 4, "overlap": "auto", "hierarchical": True}
COMPRESSION_DEFAULTS = {"compression": "none", "compression_rank": 4}  # averaging's and EASGD's
AVERAGING_DEFAULTS = {**COMPRESSION_DEFAULTS, "reset_optimizer": False}  # averaging's


def write_job(tmp_path: Path, text: str, name: str = "job") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


def config_error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    """Load a job that must fail; return the message after checking it is one line naming the file (or the last
    override, which gives the key at fault in these tests)."""
    path = write_job(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_job(path, overrides=overrides)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--set {overrides[-1]!r}: " if overrides else f"{path}: ")  # named as given
    return message


# ---------------------------------------------------------------- loading and defaults


def test_minimal_job_gets_every_default(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL, name="paper"))
    assert isinstance(job, JobConfig)
    assert job.name == "paper"
    assert job.model.input == [123]
    assert job.model.layers == [{"dense": 100, "activation": "relu"}, {"dropout": 0.5}, {"dense": 2}]
    assert job.model.factory is None and job.model.arguments == {}
    assert job.data.train == "/nowhere/train" and job.data.test is None
    assert job.algorithm == AlgorithmConfig(name="sync", options=SYNC_DEFAULTS)
    assert job.train == TrainConfig(
        epochs=1, batch_size=32, optimizer={"name": "sgd", "lr": 0.01}, loss="cross_entropy",
        seed=0, eval_every=1, shuffle=True,
    )
    assert job.cluster == ClusterConfig(workers=1, threads=0, device="auto", timeout=300.0)
    assert job.output == OutputConfig(run_dir=None, progress="auto")


def test_every_section_is_read(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL + """
        test = "/nowhere/test"

        [algorithm]
        name = "averaging"
        period = 5

        [train]
        epochs = 4
        batch_size = 64
        optimizer = { name = "adam", lr = 0.001 }
        loss = "mse"
        seed = 7
        eval_every = 2
        shuffle = false

        [cluster]
        workers = 3
        threads = 2
        device = "cpu"
        timeout = 60

        [output]
        run_dir = "runs/here"
        progress = "lines"
    """))
    assert job.data.test == "/nowhere/test"
    assert job.algorithm == AlgorithmConfig(name="averaging", options={"period": 5, **AVERAGING_DEFAULTS})
    assert job.train == TrainConfig(
        epochs=4, batch_size=64, optimizer={"name": "adam", "lr": 0.001}, loss="mse",
        seed=7, eval_every=2, shuffle=False,
    )
    assert job.cluster == ClusterConfig(workers=3, threads=2, device="cpu", timeout=60)
    assert job.output == OutputConfig(run_dir="runs/here", progress="lines")


def test_averaging_period_defaults_to_epoch(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL + '\n[algorithm]\nname = "averaging"\n'))
    assert job.algorithm.options == {"period": "epoch", **AVERAGING_DEFAULTS}


def test_relative_dataset_path_resolves_against_the_job_file(tmp_path, monkeypatch):
    (tmp_path / "jobs" / "train-set").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = write_job(tmp_path / "jobs", MINIMAL.replace("/nowhere/train", "train-set"))
    assert load_job(path).data.train == str(tmp_path / "jobs" / "train-set")


# ---------------------------------------------------------------- errors name the key


def test_unknown_section_names_it_with_a_suggestion(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[trian]\nepochs = 2\n")
    assert "trian" in message and "unknown" in message
    assert "did you mean 'train'" in message


def test_unknown_key_in_a_section_suggests_the_right_one(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[train]\nepoch = 3\n")
    assert "train.epoch: unknown key" in message
    assert "did you mean 'train.epochs'?" in message


def test_unknown_key_in_cluster_suggests(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[cluster]\nworker = 3\n")
    assert "cluster.worker: unknown key (did you mean 'cluster.workers'?)" in message


def test_unknown_algorithm_option_names_the_key(tmp_path):
    message = config_error(tmp_path, MINIMAL + '\n[algorithm]\nname = "averaging"\nperiodd = 3\n')
    assert "algorithm.periodd: unknown key (did you mean 'algorithm.period'?)" in message


def test_option_of_another_algorithm_is_set_aside(tmp_path):
    # `--set algorithm.name=sync` on a job written for averaging must work: period is not sync's.
    path = tmp_path / "job.toml"
    path.write_text(MINIMAL + '\n[algorithm]\nname = "averaging"\nperiod = 3\n')
    job = load_job(path, ["algorithm.name=sync"])
    assert job.algorithm.name == "sync" and job.algorithm.options == SYNC_DEFAULTS
    assert job.to_dict()["algorithm"] == {"name": "sync", **SYNC_DEFAULTS}


def test_option_no_algorithm_knows_is_unknown(tmp_path):
    message = config_error(tmp_path, MINIMAL + '\n[algorithm]\nname = "sync"\nperiodd = 3\n')
    assert "algorithm.periodd: unknown key (did you mean 'algorithm.period'?)" in message


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        ("train", 'epochs = "3"', "train.epochs"),
        ("train", "batch_size = 2.5", "train.batch_size"),
        ("train", "shuffle = 1", "train.shuffle"),
        ("train", "epochs = true", "train.epochs"),
        ("cluster", 'timeout = "soon"', "cluster.timeout"),
        ("cluster", "timeout = true", "cluster.timeout"),
        ("output", "progress = 3", "output.progress"),
    ],
)
def test_wrong_type_names_the_key_and_value(tmp_path, section, line, key):
    message = config_error(tmp_path, MINIMAL + f"\n[{section}]\n{line}\n")
    value = tomllib.loads(line)
    (raw,) = value.values()
    assert f"{key}: expected" in message
    assert repr(raw) in message


def test_wrong_type_in_data_and_model(tmp_path):
    message = config_error(tmp_path, MINIMAL.replace('"/nowhere/train"', "5"))
    assert "data.train: expected str" in message
    message = config_error(tmp_path, MINIMAL.replace("input = [123]", 'input = ["wide"]'))
    assert "model.input: expected" in message


def test_section_that_is_not_a_table(tmp_path):
    message = config_error(tmp_path, 'train = 3\n' + MINIMAL)
    assert "train: must be a table" in message


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        ("train", "epochs = 0", "train.epochs"),
        ("train", "epochs = -2", "train.epochs"),
        ("train", "batch_size = 0", "train.batch_size"),
        ("train", "eval_every = 0", "train.eval_every"),
        ("cluster", "workers = 0", "cluster.workers"),
        ("cluster", "threads = -1", "cluster.threads"),
        ("cluster", "timeout = 0", "cluster.timeout"),
        ("cluster", "timeout = -1.5", "cluster.timeout"),
    ],
)
def test_out_of_range_number_names_the_key(tmp_path, section, line, key):
    message = config_error(tmp_path, MINIMAL + f"\n[{section}]\n{line}\n")
    value = line.split("=")[1].strip()
    assert f"{key}: must be" in message
    assert value in message


def test_epochs_zero_message_is_exact(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[train]\nepochs = 0\n")
    assert message.endswith("train.epochs: must be an integer >= 1, got 0")


@pytest.mark.parametrize(
    ("section", "line", "key", "choices"),
    [
        ("output", 'progress = "fancy"', "output.progress", ("auto", "bar", "lines", "none")),
        ("train", 'loss = "hinge"', "train.loss", ("cross_entropy", "binary_cross_entropy", "mse")),
        ("cluster", 'device = "tpu"', "cluster.device", ("auto", "cpu", "cuda")),
    ],
)
def test_bad_choice_names_the_key_and_lists_choices(tmp_path, section, line, key, choices):
    message = config_error(tmp_path, MINIMAL + f"\n[{section}]\n{line}\n")
    bad = line.split('"')[1]
    assert message.split(": ", 1)[1].startswith(f"{key}:")
    assert repr(bad) in message
    assert all(choice in message for choice in choices)


def test_optimizer_without_a_name(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[train]\noptimizer = { lr = 0.1 }\n")
    assert "train.optimizer.name: required" in message


def test_unknown_algorithm_names_the_key_and_lists_choices(tmp_path):
    message = config_error(tmp_path, MINIMAL + '\n[algorithm]\nname = "downpoor"\n')
    assert "algorithm.name" in message and "'downpoor'" in message
    assert all(name in message for name in REGISTRY)


def test_algorithm_name_close_to_a_known_one_is_suggested(tmp_path):
    message = config_error(tmp_path, MINIMAL + '\n[algorithm]\nname = "averagin"\n')
    assert "did you mean 'averaging'?" in message


def test_algorithm_name_of_the_wrong_type(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[algorithm]\nname = 3\n")
    assert "algorithm.name: expected a string, got 3" in message


@pytest.mark.parametrize("period", ["0", "-4", '"week"', "true"])
def test_bad_averaging_period(tmp_path, period):
    message = config_error(tmp_path, MINIMAL + f'\n[algorithm]\nname = "averaging"\nperiod = {period}\n')
    assert "algorithm.period:" in message
    assert repr(tomllib.loads(f"v = {period}")["v"]) in message


def test_both_layers_and_factory(tmp_path):
    message = config_error(tmp_path, MINIMAL.replace("[model]", '[model]\nfactory = "pkg.mod:build"'))
    assert "model.layers" in message and "model.factory" in message and "exactly one" in message


def test_neither_layers_nor_factory(tmp_path):
    message = config_error(tmp_path, "[model]\ninput = [3]\n[data]\ntrain = 'x'\n")
    assert "model.layers" in message and "model.factory" in message and "exactly one" in message


def test_factory_without_colon(tmp_path):
    message = config_error(tmp_path, "[model]\nfactory = 'pkg.build'\n[data]\ntrain = 'x'\n")
    assert "model.factory: must look like 'package.module:function'" in message


@pytest.mark.parametrize("shape", ["[]", "[0]", "[3, -1]"])
def test_bad_model_input(tmp_path, shape):
    message = config_error(tmp_path, MINIMAL.replace("input = [123]", f"input = {shape}"))
    assert "model.input: must be a list of positive integers" in message


def test_missing_data_section(tmp_path):
    message = config_error(tmp_path, MINIMAL.split("[data]")[0])
    assert message.endswith("data: required section is missing")


def test_missing_model_section(tmp_path):
    message = config_error(tmp_path, "[data]\ntrain = 'x'\n")
    assert message.endswith("model: required section is missing")


def test_missing_data_train(tmp_path):
    message = config_error(tmp_path, MINIMAL.replace('train = "/nowhere/train"', 'test = "/nowhere/test"'))
    assert "data.train: required" in message


def test_malformed_toml(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[train\nepochs = 3\n")
    assert "invalid TOML" in message
    assert "line" in message  # tomllib says where


def test_missing_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    assert str(caught.value) == f"{path}: job file not found"


def test_config_error_is_a_shoal_error():
    assert issubclass(ConfigError, ShoalError)


# ---------------------------------------------------------------- overrides


def test_overrides_through_load_job(tmp_path):
    path = write_job(tmp_path, MINIMAL + '\n[train]\noptimizer = { name = "sgd", lr = 0.1, momentum = 0.9 }\n')
    job = load_job(path, overrides=["algorithm.name=averaging", "train.epochs=3", "train.optimizer.lr=0.5"])
    assert job.algorithm == AlgorithmConfig(name="averaging", options={"period": "epoch", **AVERAGING_DEFAULTS})
    assert job.train.epochs == 3
    assert job.train.optimizer == {"name": "sgd", "lr": 0.5, "momentum": 0.9}


def test_override_algorithm_name_sync(tmp_path):
    path = write_job(tmp_path, MINIMAL + '\n[algorithm]\nname = "averaging"\n')
    assert load_job(path).algorithm.name == "averaging"
    assert load_job(path, overrides=["algorithm.name=sync"]).algorithm == AlgorithmConfig("sync", SYNC_DEFAULTS)


def test_override_string_without_quotes(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL), overrides=["output.progress=none", "cluster.device=cpu"])
    assert job.output.progress == "none"
    assert job.cluster.device == "cpu"


def test_override_values_are_read_as_toml(tmp_path):
    job = load_job(
        write_job(tmp_path, MINIMAL),
        overrides=['output.run_dir="runs/x y"', "train.shuffle=false", "cluster.timeout=2.5",
                   'train.optimizer={ name = "adam", lr = 0.003 }', "algorithm.name=averaging", "algorithm.period=4"],
    )
    assert job.output.run_dir == "runs/x y"
    assert job.train.shuffle is False
    assert job.cluster.timeout == 2.5
    assert job.train.optimizer == {"name": "adam", "lr": 0.003}
    assert job.algorithm.options == {"period": 4, **AVERAGING_DEFAULTS}


def test_later_override_wins(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL), overrides=["train.epochs=2", "train.epochs=5"])
    assert job.train.epochs == 5


def test_override_is_validated_like_the_file(tmp_path):
    message = config_error(tmp_path, MINIMAL, overrides=("train.epochs=0",))
    assert "train.epochs: must be an integer >= 1, got 0" in message
    message = config_error(tmp_path, MINIMAL, overrides=("train.epoch=2",))
    assert "did you mean 'train.epochs'?" in message
    message = config_error(tmp_path, MINIMAL, overrides=("train.epochs=three",))
    assert "train.epochs: expected int, got 'three'" in message


@pytest.mark.parametrize("text", ["train.epochs", "=3", "  =3", ""])
def test_malformed_override(text):
    with pytest.raises(ConfigError) as caught:
        parse_override(text)
    assert "section.key=value" in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError):
        apply_overrides({}, [text])


def test_malformed_override_through_load_job(tmp_path):
    path = write_job(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as caught:
        load_job(path, overrides=["train.epochs"])
    assert "'train.epochs'" in str(caught.value)


def test_override_through_a_value_that_is_not_a_table():
    with pytest.raises(ConfigError) as caught:
        apply_overrides({"train": {"epochs": 3}}, ["train.epochs.x=1"])
    assert "'epochs' is not a table" in str(caught.value)


def test_parse_override():
    assert parse_override("train.epochs=3") == (["train", "epochs"], 3)
    assert parse_override(" train.optimizer.lr = 0.5") == (["train", "optimizer", "lr"], 0.5)
    assert parse_override("algorithm.name=sync") == (["algorithm", "name"], "sync")
    assert parse_override("output.run_dir=a=b") == (["output", "run_dir"], "a=b")
    assert parse_override("model.input=[28, 28]") == (["model", "input"], [28, 28])


def test_apply_overrides_returns_a_copy():
    raw = {"train": {"optimizer": {"name": "sgd", "lr": 0.1}}}
    changed = apply_overrides(raw, ["train.optimizer.lr=0.5", "cluster.workers=4"])
    assert changed == {"train": {"optimizer": {"name": "sgd", "lr": 0.5}}, "cluster": {"workers": 4}}
    assert raw == {"train": {"optimizer": {"name": "sgd", "lr": 0.1}}}


def test_override_optimizer_lr_keeps_the_default_optimizer(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL), overrides=["train.optimizer.lr=0.5"])
    assert job.train.optimizer == {"name": "sgd", "lr": 0.5}


def test_override_with_spaces_around_an_unquoted_string(tmp_path):
    job = load_job(write_job(tmp_path, MINIMAL), overrides=["algorithm.name = averaging"])
    assert job.algorithm.name == "averaging"


def test_negative_seed_is_refused_or_usable(tmp_path):
    try:
        job = load_job(write_job(tmp_path, MINIMAL + "\n[train]\nseed = -1\n"))
    except ConfigError as error:
        assert "train.seed" in str(error)
        return
    order = epoch_order(10, seed=job.train.seed, epoch=0, rank=0)
    assert sorted(order.tolist()) == list(range(10))


@pytest.mark.parametrize("value", ['"sync"', "3"])
def test_algorithm_that_is_not_a_table(tmp_path, value):
    message = config_error(tmp_path, f"algorithm = {value}\n" + MINIMAL)
    assert "algorithm: must be a table" in message


def test_nan_timeout_is_refused(tmp_path):
    message = config_error(tmp_path, MINIMAL + "\n[cluster]\ntimeout = nan\n")
    assert "cluster.timeout" in message


# ---------------------------------------------------------------- round trip


def test_to_toml_round_trip_of_defaults(tmp_path):
    path = write_job(tmp_path, MINIMAL)
    job = load_job(path)
    (tmp_path / "copy").mkdir()
    again = load_job(write_job(tmp_path / "copy", job.to_toml()))  # same stem, so the same name
    assert again == job


def test_to_toml_round_trip_of_a_full_job(tmp_path):
    text = MINIMAL.replace("input = [123]", "input = [1, 28, 28]") + """
        test = "/nowhere/test"
        [algorithm]
        name = "averaging"
        period = 7
        [train]
        epochs = 2
        optimizer = { name = "adam", lr = 0.001, betas = [0.8, 0.9] }
        loss = "mse"
        shuffle = false
        [cluster]
        workers = 4
        device = "cpu"
        timeout = 12.5
        [output]
        run_dir = "runs/r"
        progress = "none"
    """
    job = load_job(write_job(tmp_path, text))
    dumped = job.to_toml()
    assert tomllib.loads(dumped)["algorithm"] == {"name": "averaging", "period": 7, **AVERAGING_DEFAULTS}
    (tmp_path / "copy").mkdir()
    assert load_job(write_job(tmp_path / "copy", dumped)) == job


def test_to_toml_round_trip_of_a_factory_job():
    job = from_dict({"model": {"factory": "pkg.mod:build", "arguments": {"width": 8, "names": ["a"]}},
                     "data": {"train": "t"}})
    assert from_dict(tomllib.loads(job.to_toml())) == job


def test_to_dict_leaves_out_none_and_flattens_options():
    job = from_dict({"model": {"layers": [{"dense": 2}]}, "data": {"train": "t"},
                     "algorithm": {"name": "averaging", "period": 3}})
    raw = job.to_dict()
    assert raw["algorithm"] == {"name": "averaging", "period": 3, **AVERAGING_DEFAULTS}
    assert "test" not in raw["data"] and "run_dir" not in raw["output"] and "input" not in raw["model"]
