"""The synthetic Medicare claims: determinism, the attribute and feature layout, rarity, learnability, CLI."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.tree import DecisionTreeClassifier

from shoal.cli import main
from shoal.data import claims
from shoal.data.claims import synth_claims
from shoal.data.encoding import Encoding
from shoal.errors import DataError

ROWS = 10_000


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few thousand rows, so that a quick test still spans several chunks."""
    monkeypatch.setattr(claims, "CHUNK_ROWS", 4_000)


def blocks(names: list[str]) -> dict[str, list[int]]:
    """Feature columns of each categorical attribute, from the feature names alone."""
    found: dict[str, list[int]] = {}
    for column, name in enumerate(names):
        if "=" in name:
            found.setdefault(name.split("=")[0], []).append(column)
    return found


def balanced(features: np.ndarray, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """All positives and as many negatives drawn at random: the usual under-sampling for rare classes."""
    positives = np.flatnonzero(labels == 1)
    negatives = np.random.default_rng(seed).choice(np.flatnonzero(labels == 0), len(positives), replace=False)
    rows = np.concatenate([positives, negatives])
    return features[rows], labels[rows]


class Interactions:
    """Appends to the features: charge above the procedure's mean, once per specialty, and services per
    beneficiary above the procedure's mean times charge below it (means from the rows given)."""

    def __init__(self, x: np.ndarray):
        names = claims.FEATURE_NAMES
        self.codes = [i for i, name in enumerate(names) if name.startswith("procedure_code=")]
        self.specialties = [i for i, name in enumerate(names) if name.startswith("specialty=")]
        self.charge, self.services = names.index("average_submitted_charge"), names.index("services_per_beneficiary")
        code = x[:, self.codes].argmax(axis=1)
        self.usual = {column: np.array([x[code == c, column].mean() if (code == c).any() else 0.0
                                        for c in range(len(self.codes))]) for column in (self.charge, self.services)}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        code = x[:, self.codes].argmax(axis=1)
        charge = x[:, self.charge] - self.usual[self.charge][code]
        services = x[:, self.services] - self.usual[self.services][code]
        upcoding = np.maximum(charge, 0)[:, None] * x[:, self.specialties]
        volume = np.maximum(services, 0) * np.maximum(-charge, 0)
        return np.hstack([x, upcoding, volume[:, None]])


def test_same_seed_gives_identical_bytes_other_seed_other_rows_same_task(tmp_path, small_chunks):
    first = synth_claims(str(tmp_path / "first"), ROWS, seed=3, task_seed=4)
    synth_claims(str(tmp_path / "second"), ROWS, seed=3, task_seed=4)
    assert folder_bytes(tmp_path / "first") == folder_bytes(tmp_path / "second")
    other = synth_claims(str(tmp_path / "other"), ROWS, seed=5, task_seed=4)
    assert not np.array_equal(first.read_rows(0, 100)[0], other.read_rows(0, 100)[0])
    # A train and a test set of one task share the encoding and the numeric scales.
    assert other.meta["attributes"] == first.meta["attributes"]
    assert other.meta["encoding"] == first.meta["encoding"] and other.feature_names == first.feature_names
    new_task = synth_claims(str(tmp_path / "task"), ROWS, seed=3, task_seed=5)
    assert new_task.meta["attributes"] != first.meta["attributes"]


def test_attributes_features_and_meta(tmp_path):
    dataset = synth_claims(str(tmp_path / "claims"), ROWS, seed=1, task_seed=2)
    attributes = dataset.meta["attributes"]
    assert len(attributes) == 29
    assert [a["about"] for a in attributes].count("provider") == 15
    assert [a["about"] for a in attributes].count("procedure") == 14
    # The provider id is listed but not written: it would only let a model memorize providers.
    assert attributes[0] == {"name": "npi", "about": "provider", "kind": "identifier", "written": False}
    categorical = [a["name"] for a in attributes if a["kind"] == "categorical"]
    numeric = [a["name"] for a in attributes if a["kind"] == "numeric"]
    assert {"gender", "state", "specialty", "place_of_service", "procedure_code"} <= set(categorical)
    encoding = dataset.meta["encoding"]
    assert list(encoding["categories"]) == categorical and encoding["columns"] == [a["name"] for a in attributes[1:]]
    names = dataset.feature_names
    expected = [
        name
        for a in attributes
        if a["kind"] != "identifier"
        for name in ([f"{a['name']}={c}" for c in encoding["categories"][a["name"]]] if a["kind"] == "categorical"
                     else [a["name"]])
    ]
    assert names == expected
    assert dataset.shape == (len(names),) == (sum(map(len, encoding["categories"].values())) + len(numeric),)
    # The encoding reads as an import's would: a table of these columns could be encoded like this set.
    assert Encoding.from_dataset(str(tmp_path / "claims")).feature_names == names
    assert "state=CA" in names and "average_submitted_charge" in names and not any("npi" in n for n in names)
    assert dataset.feature_dtype == np.float32 and dataset.classes == [0, 1]
    source = dataset.meta["source"]
    assert (source["generator"], source["rows"], source["seed"], source["task_seed"]) == ("claims", ROWS, 1, 2)
    assert source["positives_per_million"] == pytest.approx(1_400 / 3.3)


def test_one_hot_blocks_and_standardized_numbers(tmp_path):
    dataset = synth_claims(str(tmp_path / "claims"), 20_000, seed=1)
    features, _ = dataset.read_all()
    found = blocks(dataset.feature_names)
    assert list(found) == list(dataset.meta["encoding"]["categories"])
    for attribute, columns in found.items():
        block = features[:, columns]
        assert set(np.unique(block)) <= {0.0, 1.0}, attribute
        np.testing.assert_array_equal(block.sum(axis=1), np.ones(len(block)), err_msg=attribute)
        assert (block.sum(axis=0) > 0).sum() >= min(2, len(columns)), attribute  # more than one category occurs
    numeric = [a for a in dataset.meta["attributes"] if a["kind"] == "numeric"]
    for attribute in numeric:
        column = features[:, dataset.feature_names.index(attribute["name"])]
        assert abs(column.mean()) < 0.05 and abs(column.std() - 1) < 0.05, attribute["name"]
    # meta.json's transform inverts to the raw units: CMS leaves out rows of fewer than 11 beneficiaries.
    unique = next(a for a in numeric if a["name"] == "beneficiary_unique_count")
    column = features[:, dataset.feature_names.index("beneficiary_unique_count")].astype(np.float64)
    raw = np.expm1(column * unique["scale"] + unique["center"])
    assert unique["log1p"] and raw.min() == pytest.approx(11, rel=1e-4)
    charge = next(a for a in numeric if a["name"] == "average_submitted_charge")
    column = features[:, dataset.feature_names.index("average_submitted_charge")].astype(np.float64)
    dollars = np.expm1(column * charge["scale"] + charge["center"])
    assert 1 < dollars.min() and np.median(dollars) < 1_000 < dollars.max() < 100_000


def test_a_set_too_small_for_a_positive_still_has_both_classes(tmp_path):
    dataset = synth_claims(str(tmp_path / "tiny"), 50, seed=1)
    assert dataset.read_all()[1].sum() == 0 and dataset.meta["source"]["positives"] == 0
    assert dataset.classes == [0, 1]


@pytest.mark.parametrize(("rows", "per_million"), [(300_000, claims.POSITIVES_PER_MILLION), (60_000, 5_000.0)])
def test_positive_count_is_within_one_per_chunk_of_the_target(tmp_path, rows, per_million):
    dataset = synth_claims(str(tmp_path / "claims"), rows, seed=7, positives_per_million=per_million)
    positives = int(dataset.read_all()[1].sum())
    target = rows * per_million / 1e6
    assert abs(positives - target) <= math.ceil(rows / claims.CHUNK_ROWS)
    assert abs(positives / target - 1) < 0.05
    assert dataset.meta["source"]["positives"] == positives


def test_learnable_by_a_linear_model_but_not_trivially(tmp_path):
    # A higher rate than the default gives thousands of positives from a quick 200,000 rows; the task
    # is the same at any rate up to a few percent (the risk levels off at RISK_CAP).
    rate = 10_000.0
    train = synth_claims(str(tmp_path / "train"), 200_000, seed=1, positives_per_million=rate).read_all()
    test = synth_claims(str(tmp_path / "test"), 100_000, seed=2, positives_per_million=rate).read_all()
    train_x, train_y = balanced(*train, seed=0)
    test_x, test_y = balanced(*test, seed=1)
    assert len(train_y) == 2 * 2_000 and len(test_y) == 2 * 1_000
    linear = LogisticRegression(max_iter=2_000).fit(train_x, train_y)
    linear_auc = roc_auc_score(test_y, linear.decision_function(test_x))
    assert 0.75 < linear_auc < 0.95
    tree = DecisionTreeClassifier(max_depth=6, min_samples_leaf=20, random_state=0).fit(train_x, train_y)
    tree_auc = roc_auc_score(test_y, tree.predict_proba(test_x)[:, 1])
    assert 0.65 < tree_auc < 0.95
    # The labels hang on interactions: given them, the same linear model gets much further.
    interactions = Interactions(train_x)
    richer = LogisticRegression(max_iter=2_000).fit(interactions(train_x), train_y)
    richer_auc = roc_auc_score(test_y, richer.decision_function(interactions(test_x)))
    assert linear_auc + 0.04 < richer_auc < 0.97


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"rows": 0}, "rows must be an integer of at least 1, got 0"),
        ({"rows": 10, "seed": -1}, "seed must be an integer of at least 0, got -1"),
        ({"rows": 10, "positives_per_million": 0}, "positives_per_million must be a number above 0 and below "
                                                   "1000000, got 0"),
        ({"rows": 10, "positives_per_million": float("nan")}, "positives_per_million must be .*, got nan"),
    ],
)
def test_bad_arguments_leave_nothing(tmp_path, arguments, problem):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=f"^{out}: {problem}$"):
        synth_claims(str(out), **arguments)
    assert os.listdir(tmp_path) == []


def test_cli_writes_a_claims_dataset(tmp_path, capsys):
    out = tmp_path / "claims"
    status = main(["data", "synth", "claims", "--rows", "3000", "--out", str(out), "--seed", "2",
                   "--positives-per-million", "2000"])
    assert status == 0
    shape = len(claims.FEATURE_NAMES)
    assert capsys.readouterr().out == f"{out}: 3,000 rows, sample shape [{shape}], classes [0, 1]\n"
    synth_claims(str(tmp_path / "same"), 3_000, seed=2, positives_per_million=2_000)
    assert folder_bytes(out) == folder_bytes(tmp_path / "same")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--rows", "0"], "--rows: must be at least 1, got 0"),
        (["--rows", "10", "--positives-per-million", "-3"], "{out}: positives_per_million must be a number above 0 "
                                                            "and below 1000000, got -3.0"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line_and_leave_nothing(tmp_path, capsys, arguments, message):
    out = tmp_path / "claims"
    assert main(["data", "synth", "claims", "--out", str(out), *arguments]) == 2
    assert capsys.readouterr().err == f"shoal: error: {message.format(out=out)}\n"
    assert os.listdir(tmp_path) == []


def test_cli_refuses_an_existing_output_and_leaves_it_alone(tmp_path, capsys):
    out = tmp_path / "claims"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["data", "synth", "claims", "--rows", "100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: ") and "already exists" in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == ["claims"] and folder_bytes(out) == {"keep.txt": b"mine"}
