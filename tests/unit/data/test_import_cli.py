"""`shoal data import` through the command line: declared classes, and every kind of bad input.

Each bad input must make `main` return 2 and print exactly one line, `shoal: error: ...`, naming
the file (and line or row), and leave nothing in the output's parent folder: no dataset, no
temporary folder.
"""

from __future__ import annotations

import errno
import gzip
import os

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.cli import main
from tests.unit.data.test_import_idx import idx_bytes
from tests.unit.data.test_importers import read_back


def run_import(capsys, source, out, *options: str) -> tuple[int, str, str]:
    code = main(["data", "import", str(source), str(out), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def fails_cleanly(capsys, source, out, options: list[str], message: str) -> None:
    code, stdout, stderr = run_import(capsys, source, out, *options)
    assert code == 2
    assert stdout == ""
    assert stderr == f"shoal: error: {message}\n", stderr
    assert not out.parent.exists() or os.listdir(out.parent) == [], os.listdir(out.parent)


@pytest.fixture
def out(tmp_path):
    return tmp_path / "datasets" / "out"


def test_declared_classes_accept_a_clean_file(tmp_path, capsys, out):
    source = tmp_path / "small.csv"
    source.write_text("a,b,y\n1,2,cat\n3,4,dog\n")
    code, stdout, stderr = run_import(capsys, source, out, "--format", "csv", "--classes", "cat, dog,emu")
    assert (code, stderr) == (0, "")
    assert stdout == f"{out}: 2 rows, sample shape [2], classes ['cat', 'dog']\n"
    _, labels, _ = read_back(out)
    assert labels.tolist() == ["cat", "dog"]


def test_label_outside_the_declared_classes_csv_and_libsvm(tmp_path, capsys, out):
    source = tmp_path / "small.csv"
    source.write_text("a,y\n1,0\n\n2,1\n3,7\n")
    fails_cleanly(capsys, source, out, ["--format", "csv", "--classes", "0,1"],
                  f"{source}:5: label 7 is not one of the declared classes 0, 1")
    svm = tmp_path / "small.svm"
    svm.write_text("# header comment\n+1 1:1\n\n-1 2:1\n+2 1:1\n")
    # "--classes=-1,+1", not "--classes -1,+1", which argparse would read as an option
    fails_cleanly(capsys, svm, out, ["--format", "libsvm", "--classes=-1,+1"],
                  f"{svm}:5: label 2 is not one of the declared classes -1, +1")


def test_label_outside_the_declared_classes_binary_formats(tmp_path, capsys, out):
    np.save(tmp_path / "x.npy", np.zeros((5, 2)))
    np.save(tmp_path / "y.npy", np.array(["a", "b", "a", "c", "b"]))
    fails_cleanly(capsys, tmp_path / "x.npy", out, ["--format", "npy", "--label", str(tmp_path / "y.npy"),
                                                    "--classes", "a,b"],
                  f"{tmp_path / 'y.npy'}: row 4: label 'c' is not one of the declared classes a, b")
    source = tmp_path / "table.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "y": [0.0, 1.0, 2.0]}), source)
    fails_cleanly(capsys, source, out, ["--format", "parquet", "--classes", "0,1"],
                  f"{source}: row 3: label 2.0 is not one of the declared classes 0, 1")
    (tmp_path / "x.idx").write_bytes(idx_bytes(np.zeros((3, 2, 2), dtype=np.uint8)))
    (tmp_path / "y.idx").write_bytes(idx_bytes(np.array([9, 8, 10], dtype=np.uint8)))
    fails_cleanly(capsys, tmp_path / "x.idx", out, ["--format", "idx", "--label", str(tmp_path / "y.idx"),
                                                    "--classes", ",".join(map(str, range(10)))],
                  f"{tmp_path / 'y.idx'}: row 3: label 10 is not one of the declared classes "
                  "0, 1, 2, 3, 4, 5, 6, 7, 8, 9")


def test_malformed_lines_name_file_and_line(tmp_path, capsys, out):
    svm = tmp_path / "bad.svm"
    svm.write_text("1 1:1\n0 2-1\n")
    fails_cleanly(capsys, svm, out, ["--format", "libsvm"], f"{svm}:2: malformed pair '2-1' (expected index:value)")
    csv = tmp_path / "bad.csv"
    csv.write_text("a,b,y\n1,2,0\n3,4\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv"], f"{csv}:3: has 2 fields, but the header has 3")
    csv.write_text("a,state,y\n1,CA,0\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv"],
                  f"{csv}:2: column 'state' holds 'CA', which is not a number "
                  "(if 'state' is categorical, declare it: --categorical state)")


def test_feature_count_mismatch_names_the_file(tmp_path, capsys, out):
    csv = tmp_path / "small.csv"
    csv.write_text("a,b,y\n1,2,0\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv", "--n-features", "3"],
                  f"{csv}: has 2 feature columns, but n_features=3")
    svm = tmp_path / "small.svm"
    svm.write_text("1 1:1 5:2\n")
    fails_cleanly(capsys, svm, out, ["--format", "libsvm", "--n-features", "4"],
                  f"{svm}:1: index 5 is above the feature count 4")
    np.save(tmp_path / "x.npy", np.zeros((3, 2, 2)))
    np.save(tmp_path / "y.npy", np.zeros(3))
    fails_cleanly(capsys, tmp_path / "x.npy", out, ["--format", "npy", "--label", str(tmp_path / "y.npy"),
                                                    "--n-features", "5"],
                  f"{tmp_path / 'x.npy'}: samples have 4 features (shape (2, 2)), but n_features=5")


def test_empty_inputs(tmp_path, capsys, out):
    csv = tmp_path / "empty.csv"
    csv.write_text("a,b,y\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv"], f"{csv}: no data rows after the header: the source is empty")
    svm = tmp_path / "empty.svm"
    svm.write_text("\n# nothing\n")
    fails_cleanly(capsys, svm, out, ["--format", "libsvm"], f"{svm}: no data lines: the source is empty")
    np.save(tmp_path / "x.npy", np.zeros((0, 3)))
    np.save(tmp_path / "y.npy", np.zeros(0))
    fails_cleanly(capsys, tmp_path / "x.npy", out, ["--format", "npy", "--label", str(tmp_path / "y.npy")],
                  f"{tmp_path / 'x.npy'}: holds no samples: the source is empty")
    (tmp_path / "x.idx").write_bytes(idx_bytes(np.zeros((0, 2, 2), dtype=np.uint8)))
    (tmp_path / "y.idx").write_bytes(idx_bytes(np.zeros(0, dtype=np.uint8)))
    fails_cleanly(capsys, tmp_path / "x.idx", out, ["--format", "idx", "--label", str(tmp_path / "y.idx")],
                  f"{tmp_path / 'x.idx'}: holds no samples: the source is empty")
    with h5py.File(tmp_path / "empty.h5", "w") as handle:
        handle["x"], handle["y"] = np.zeros((0, 2)), np.zeros(0)
    fails_cleanly(capsys, tmp_path / "empty.h5", out, ["--format", "hdf5"],
                  f"{tmp_path / 'empty.h5'}:/x: holds no samples: the source is empty")
    pq.write_table(pa.table({"a": pa.array([], pa.float64()), "y": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    fails_cleanly(capsys, tmp_path / "e.parquet", out, ["--format", "parquet"],
                  f"{tmp_path / 'e.parquet'}: holds no rows: the source is empty")


def test_idx_bad_magic_truncation_and_label_count(tmp_path, capsys, out):
    images = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3)
    labels = tmp_path / "labels.gz"
    labels.write_bytes(gzip.compress(idx_bytes(np.array([0, 1, 0, 1], dtype=np.uint8))))
    bad = tmp_path / "images.idx"
    bad.write_bytes(b"\x08\x03" + idx_bytes(images)[2:])
    fails_cleanly(capsys, bad, out, ["--format", "idx", "--label", str(labels)],
                  f"{bad}: not an IDX file: bad magic number 0x08030803 "
                  "(expected two zero bytes, a type code and a dimension count)")
    bad.write_bytes(idx_bytes(images)[:-1])
    fails_cleanly(capsys, bad, out, ["--format", "idx", "--label", str(labels)],
                  f"{bad}: truncated: the header declares 4 samples, but the data holds 3")
    bad.write_bytes(idx_bytes(images[:3]))
    fails_cleanly(capsys, bad, out, ["--format", "idx", "--label", str(labels)],
                  f"{labels}: holds 4 labels, but {bad} holds 3 samples")


def test_hdf5_and_parquet_specific_errors(tmp_path, capsys, out):
    with h5py.File(tmp_path / "data.h5", "w") as handle:
        handle["x"], handle["y"] = np.zeros((3, 2)), np.zeros(3)
    fails_cleanly(capsys, tmp_path / "data.h5", out, ["--format", "hdf5", "--features", "images"],
                  f"{tmp_path / 'data.h5'}: no dataset 'images' (the file holds: x, y)")
    source = tmp_path / "table.parquet"
    pq.write_table(pa.table({"state": ["CA", None], "y": [0, 1]}), source)
    fails_cleanly(capsys, source, out, ["--format", "parquet", "--categorical", "state"],
                  f"{source}: row 2: the categorical column 'state' is empty")


def test_unseen_category_through_the_command_line(tmp_path, capsys, out):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text("size,state,y\n1,CA,0\n2,NY,1\n")
    test.write_text("size,state,y\n1,NY,0\n2,WA,1\n")
    reference = tmp_path / "train"
    code, stdout, _ = run_import(capsys, train, reference, "--format", "csv", "--categorical", "state")
    assert code == 0 and "sample shape [3]" in stdout
    fails_cleanly(capsys, test, out, ["--format", "csv", "--encoding-from", str(reference)],
                  f"{test}:3: column 'state' holds 'WA', a category the encoding of {reference} does not have "
                  "(it has: CA, NY)")


# ---------------------------------------------------------------- --force, a linked OUT, a full disk


def small_csv(tmp_path, rows: str = "1,2,cat\n3,4,dog\n"):
    source = tmp_path / "small.csv"
    source.write_text("a,b,y\n" + rows)
    return source


def test_force_replaces_a_dataset(tmp_path, capsys, out):
    assert run_import(capsys, small_csv(tmp_path), out, "--format", "csv")[0] == 0
    code, _, stderr = run_import(capsys, small_csv(tmp_path, "5,6,emu\n"), out, "--format", "csv", "--force")
    assert (code, stderr) == (0, "")
    assert read_back(out)[1].tolist() == ["emu"]
    assert os.listdir(out.parent) == ["out"]  # no temporary, no old copy left beside it


def test_force_never_deletes_a_folder_that_is_not_a_dataset(tmp_path, capsys, out):
    out.mkdir(parents=True)
    (out / "thesis.tex").write_text("years of work")
    code, stdout, stderr = run_import(capsys, small_csv(tmp_path), out, "--format", "csv", "--force")
    assert (code, stdout) == (2, "")
    assert stderr == (f"shoal: error: {out}: not a shoal dataset (a meta.json of format 'shoal.dataset' and Parquet "
                      "files, nothing else), so --force will not delete it: remove it yourself or choose another "
                      "output folder\n")
    assert (out / "thesis.tex").read_text() == "years of work" and os.listdir(out.parent) == ["out"]


def test_force_refuses_a_dataset_folder_holding_anything_else(tmp_path, capsys, out):
    assert run_import(capsys, small_csv(tmp_path), out, "--format", "csv")[0] == 0
    (out / "notes.txt").write_text("mine")
    assert run_import(capsys, small_csv(tmp_path), out, "--format", "csv", "--force")[0] == 2
    assert (out / "notes.txt").read_text() == "mine"


def test_replacing_a_dataset_is_atomic_the_old_one_stays_if_the_new_cannot_be_moved_in(tmp_path, capsys, out,
                                                                                     monkeypatch):
    assert run_import(capsys, small_csv(tmp_path), out, "--format", "csv")[0] == 0
    from shoal.data import format as dataset_format

    def failing(temporary, path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(dataset_format, "replace_durably", failing)
    with pytest.raises(OSError, match="Input/output error"):
        main(["data", "import", str(small_csv(tmp_path, "5,6,emu\n")), str(out), "--format", "csv", "--force"])
    assert read_back(out)[1].tolist() == ["cat", "dog"]  # never deleted first
    assert os.listdir(out.parent) == ["out"]


def test_a_linked_out_is_refused_in_one_line(tmp_path, capsys, out):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    out.parent.mkdir()
    out.symlink_to(target)
    for force in ([], ["--force"]):
        code, stdout, stderr = run_import(capsys, small_csv(tmp_path), out, "--format", "csv", *force)
        assert (code, stdout) == (2, "")
        assert stderr.startswith(f"shoal: error: {out}: a symbolic link") and stderr.count("\n") == 1
    assert os.listdir(target) == ["keep.txt"] and out.is_symlink()


def test_an_import_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, out, monkeypatch):
    def no_space(self, *arguments, **options):
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", no_space)
    fails_cleanly(capsys, small_csv(tmp_path), out, ["--format", "csv"],
                  f"{out}: the disk is full; nothing was written (free some space, then write it again)")


def test_a_nan_or_infinity_is_refused_at_import_naming_the_line(tmp_path, capsys, out):
    csv = tmp_path / "holes.csv"
    csv.write_text("a,b,y\n1,2,0\n3,nan,1\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv"],
                  f"{csv}:3: a non-finite feature (nan): shoal trains on none; fix or drop the row at the source")
    csv.write_text("a,b,y\n1,2,0\n-inf,4,1\n")
    fails_cleanly(capsys, csv, out, ["--format", "csv"],
                  f"{csv}:3: a non-finite feature (-inf): shoal trains on none; fix or drop the row at the source")
