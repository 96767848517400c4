"""shoal data import of several files (a list or glob patterns): the same dataset as the import of their
concatenation, for LIBSVM, CSV with one-hot columns, HDF5 and NumPy archives; refusals name the file at fault."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from shoal.cli import main
from shoal.data.importers import import_dataset
from shoal.errors import DataError


def same_dataset(joined, whole) -> None:
    features, labels = joined.read_all()
    expected_features, expected_labels = whole.read_all()
    assert np.array_equal(features, expected_features) and features.dtype == expected_features.dtype
    assert np.array_equal(labels, expected_labels)
    assert (joined.rows, joined.shape, joined.classes, joined.feature_names) == \
        (whole.rows, whole.shape, whole.classes, whole.feature_names)
    assert joined.meta.get("encoding") == whole.meta.get("encoding")


def write(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.parametrize("second_label", ["2", "2.5"], ids=["whole-labels", "a-fractional-label"])
def test_libsvm_files_join_as_their_concatenation(tmp_path, second_label):
    first = write(tmp_path / "a.svm", "1 1:0.5 3:1\n0 2:2\n1 1:1\n")
    second = write(tmp_path / "b.svm", f"0 5:1.5\n{second_label} 1:3 4:0.25\n")  # wider: index 5
    whole = write(tmp_path / "whole.svm", first.read_text() + second.read_text())
    joined = import_dataset([first, second], str(tmp_path / "joined"), "libsvm")
    same_dataset(joined, import_dataset(str(whole), str(tmp_path / "whole"), "libsvm"))
    assert joined.shape == (5,) and joined.meta["source"]["path"] == [str(first), str(second)]


def test_csv_files_with_their_own_categories_join_as_their_concatenation(tmp_path):
    header = "state,amount,label\n"
    first = write(tmp_path / "day-1.csv", header + "CA,1.5,yes\nNY,2,no\nCA,0.5,no\n")
    second = write(tmp_path / "day-2.csv", header + "TX,3,yes\nAK,1,yes\n")
    whole = write(tmp_path / "whole.csv", first.read_text() + second.read_text()[len(header):])
    joined = import_dataset(str(tmp_path / "day-*.csv"), str(tmp_path / "joined"), "csv", categorical=["state"])
    same_dataset(joined, import_dataset(str(whole), str(tmp_path / "whole"), "csv", categorical=["state"]))
    assert joined.feature_names == ["state=AK", "state=CA", "state=NY", "state=TX", "amount"]


def test_hdf5_and_npz_lists_join_as_their_concatenation(tmp_path):
    generator = np.random.default_rng(0)
    arrays = [(generator.normal(size=(rows, 3, 2)).astype(np.float32), generator.integers(0, 3, rows))
              for rows in (7, 5)]
    for index, (features, labels) in enumerate(arrays):
        with h5py.File(tmp_path / f"part{index}.h5", "w") as handle:
            handle["x"], handle["y"] = features, labels
        np.savez(tmp_path / f"part{index}.npz", x=features, y=labels)
    whole = [np.concatenate([array[position] for array in arrays]) for position in (0, 1)]
    with h5py.File(tmp_path / "whole.h5", "w") as handle:
        handle["x"], handle["y"] = whole
    reference = import_dataset(str(tmp_path / "whole.h5"), str(tmp_path / "whole"), "hdf5")
    same_dataset(import_dataset([str(tmp_path / "part0.h5"), str(tmp_path / "part1.h5")], str(tmp_path / "h5"),
                                "hdf5"), reference)
    npz = import_dataset(str(tmp_path / "part?.npz"), str(tmp_path / "npz"), "npz")
    assert np.array_equal(npz.read_all()[0], reference.read_all()[0]) and npz.rows == 12


def test_the_command_takes_several_sources_and_refusals_name_the_file(tmp_path, capsys):
    first = write(tmp_path / "a.svm", "1 1:0.5\n0 2:2\n")
    bad = write(tmp_path / "b.svm", "1 1:0.5\n0 2:x\n")
    out = tmp_path / "out"
    assert main(["data", "import", str(first), str(first), str(out), "--format", "libsvm"]) == 2
    assert f"{first}: given twice" in capsys.readouterr().err
    assert main(["data", "import", str(first), str(bad), str(out), "--format", "libsvm"]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith(f"shoal: error: {bad}:2") and "\n" not in message
    assert main(["data", "import", str(tmp_path / "none-*.svm"), str(out), "--format", "libsvm"]) == 2
    assert f"{tmp_path / 'none-*.svm'}: matches no file" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["a.svm", "b.svm"]  # no output, no parts left behind
    text = write(tmp_path / "text.csv", "f,label\n1,yes\n")
    numbers = write(tmp_path / "numbers.csv", "f,label\n1,3\n")
    with pytest.raises(DataError, match=f"{numbers}: its labels are numbers, but those of {text} are text"):
        import_dataset([text, numbers], str(out), "csv")
    np.savez(tmp_path / "narrow.npz", x=np.zeros((2, 3), np.float32), y=np.zeros(2, np.int64))
    np.savez(tmp_path / "wide.npz", x=np.zeros((2, 4), np.float32), y=np.zeros(2, np.int64))
    with pytest.raises(DataError, match="wide.npz: samples of shape \\[4\\], but .*narrow.npz has \\[3\\]"):
        import_dataset([tmp_path / "narrow.npz", tmp_path / "wide.npz"], str(out), "npz")
    assert not out.exists() and not [name for name in os.listdir(tmp_path) if name.startswith(".")]
    assert main(["data", "import", str(first), str(write(tmp_path / "c.svm", "1 3:1\n")), str(out),
                 "--format", "libsvm"]) == 0
    assert "3 rows, sample shape [3]" in capsys.readouterr().out


def test_refusals_come_before_any_part_is_imported_and_name_what_was_given(tmp_path, monkeypatch):
    first = write(tmp_path / "a.svm", "1 1:0.5\n0 2:2\n")
    second = write(tmp_path / "b.svm", "1 3:1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="b.svm: given twice"):  # one file, spelt two ways
        import_dataset([str(second), "./b.svm", str(first)], "out", "libsvm")
    with pytest.raises(DataError, match="out: rows_per_file must be at least 1, got 0"):
        import_dataset([first, second], "out", "libsvm", rows_per_file=0)
    with pytest.raises(DataError, match="missing.svm: file not found"):
        import_dataset([first, second, tmp_path / "missing.svm"], "out", "libsvm")
    with pytest.raises(DataError, match="written to local folders"):
        import_dataset([first, second], "s3://bucket/out", "libsvm")
    images = np.zeros((2, 3), np.uint8), np.ones((2, 3), np.float32)
    for name, features in zip(("grey.npz", "float.npz"), images):
        np.savez(tmp_path / name, x=features, y=np.zeros(2, np.int64))
    with pytest.raises(DataError, match="float.npz: features of type float32, but .*grey.npz has uint8"):
        import_dataset([tmp_path / "grey.npz", tmp_path / "float.npz"], "out", "npz")
    assert sorted(os.listdir(tmp_path)) == ["a.svm", "b.svm", "float.npz", "grey.npz"]


def test_a_tables_feature_count_is_the_joined_width_and_a_parts_error_names_its_file(tmp_path):
    header = "state,amount,label\n"
    first = write(tmp_path / "1.csv", header + "CA,1,0\n")
    second = write(tmp_path / "2.csv", header + "NY,2,1\n")
    joined = import_dataset([first, second], str(tmp_path / "joined"), "csv", categorical=["state"], n_features=3)
    assert joined.shape == (3,)  # state=CA, state=NY, amount: neither file alone encodes to 3
    with pytest.raises(DataError, match="encode to 3 features .*n_features=2"):
        import_dataset([first, second], str(tmp_path / "other"), "csv", categorical=["state"], n_features=2)
    many = write(tmp_path / "many.csv", header + "".join(f"CA,1,{label}\n" for label in range(10_001)))
    with pytest.raises(DataError) as refused:
        import_dataset([first, many], str(tmp_path / "other"), "csv", categorical=["state"])
    assert str(refused.value).startswith(f"{many}") and ".parts" not in str(refused.value)
    assert "more than 10000 distinct labels" in str(refused.value)  # the writer's, which named the part's folder

