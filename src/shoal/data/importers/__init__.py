"""Importers: convert CSV, LIBSVM, MNIST IDX, NumPy, HDF5 and Parquet files, and image folders, into a dataset.

This package's entry is `import_dataset`, which checks its arguments and hands them, as an
`ImportRequest`, to the format's importer. `IMPORTERS` is the one table of formats: each names
the module that reads it, imported only when a file of that format is, so h5py loads only for
HDF5 and Arrow's CSV reader only for CSV. What every importer shares is in `common`; one-hot
encoding of table columns in `shoal.data.encoding`.

To add a format: write a module here whose `import_file(request: ImportRequest)` writes the
dataset (importing from `common` only), and add its line to `IMPORTERS`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shoal.data.declared_classes import DeclaredClasses
from shoal.data.encoding import Encoding
from shoal.data.format import Dataset, check_output, open_dataset
from shoal.data.importers.common import ImportRequest, check_file
from shoal.errors import DataError


@dataclass(frozen=True)
class Importer:
    """A format's entry in `IMPORTERS`: the module that reads it, loaded when a file of that format is imported."""

    module: str  # under shoal.data.importers; it defines import_file(request: ImportRequest)
    table: bool = False  # named columns, which can be one-hot encoded (categorical, encoding_from)
    folder: bool = False  # the source is a folder, not a file

    def load(self) -> Callable[[ImportRequest], None]:
        return importlib.import_module(f"shoal.data.importers.{self.module}").import_file


IMPORTERS: dict[str, Importer] = {
    "csv": Importer("csv_format", table=True),
    "libsvm": Importer("libsvm"),
    "idx": Importer("idx"),
    "npy": Importer("numpy_arrays"),
    "npz": Importer("numpy_arrays"),
    "hdf5": Importer("hdf5"),
    "parquet": Importer("parquet", table=True),
    "images": Importer("images", folder=True),
}
FORMATS = tuple(IMPORTERS)
TABLE_FORMATS = tuple(name for name, importer in IMPORTERS.items() if importer.table)
UNLABELED = ("npy", *TABLE_FORMATS)  # formats whose rows can be imported without labels, to predict


def import_dataset(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    out: str,
    format: str,
    *,
    n_features: int | None = None,
    label: str | None = None,
    features: str | None = None,
    categorical: Sequence[str] | None = None,
    encoding_from: str | None = None,
    classes: Sequence[str] | None = None,
    rows_per_file: int = 1_000_000,
    overwrite: bool = False,
    unlabeled: bool = False,
    size: str | tuple[int, int] | None = None,
    color: str | None = None,
) -> Dataset:
    """Convert `source` (a `format` file) into the dataset folder `out` and open it.

    `source` may also be a glob pattern or a list of files (or patterns): their rows are imported, in the
    order given, into one dataset, as the import of their concatenation would be (`several`).

    `n_features` fixes the feature count (LIBSVM: otherwise the largest index seen; other
    formats: checked against the file). `label` names the label column of a CSV or Parquet
    table (a name or a 0-based column number; default the last column), the labels file of a
    features `.npy` or IDX file, or the labels dataset of an HDF5 file, whose features dataset
    `features` names. `categorical` lists the table columns to one-hot encode (names or
    numbers); `encoding_from`, a dataset folder, makes a table encode as that dataset did.
    `classes` lists the allowed labels: a row with any other label fails the import. `unlabeled`
    imports features alone, rows to predict rather than train on: a features `.npy`, or a CSV or
    Parquet table whose every column is a feature (with `encoding_from`, the training set's label
    column, where the table still has it, is left out). Format images reads a folder holding one
    subfolder of images per class: every image is resized to `size` (`HxW` or (height, width);
    without it, all must share one size) and stored as uint8 [C, H, W] in `color`, grey or rgb
    (default: rgb if any image is stored in colour, else grey).
    """
    from shoal.data.importers.several import expand_sources, import_several

    sources, out = expand_sources(source), str(out)
    if format not in IMPORTERS:
        raise DataError(f"unknown import format {format!r}; supported formats: {', '.join(FORMATS)}")
    for one in sources:  # every file before the first is imported: a missing 40th is not found after 39 imports
        if IMPORTERS[format].folder:
            _check_folder(one)
        else:
            check_file(one)
    if n_features is not None and n_features < 1:
        raise DataError(f"{sources[0]}: n_features must be at least 1, got {n_features}")
    if rows_per_file < 1:
        raise DataError(f"{out}: rows_per_file must be at least 1, got {rows_per_file}")
    if len(sources) > 1:
        if format in ("npy", "idx") and label is not None:
            raise DataError(f"{sources[0]}: several {format} files take no one labels file; import them one by one, "
                            "or as .npz archives holding features and labels")
        if "://" in out:
            raise DataError(f"{out}: datasets are written to local folders (copy the folder to the store after)")
        check_output(os.path.abspath(out), overwrite, out)
        table = IMPORTERS[format].table  # a table's width is its categories' union: checked on the joined parts

        def import_one(one: str, part: str) -> Dataset:
            return import_dataset(one, part, format, n_features=None if table else n_features, label=label,
                                  features=features, categorical=categorical, encoding_from=encoding_from,
                                  classes=classes, unlabeled=unlabeled, size=size, color=color)

        return import_several(sources, out, format, import_one, rows_per_file=rows_per_file, overwrite=overwrite,
                              padded=format == "libsvm" and n_features is None,
                              width=n_features if table else None)
    source = sources[0]
    _check_format_options(source, format, features, categorical, encoding_from)
    _check_image_options(source, format, label, size, color)
    if unlabeled and (format not in UNLABELED or label is not None or classes is not None):
        raise DataError(f"{source}: unlabeled: features alone, from {', '.join(UNLABELED)} (no label or classes); "
                        f"{format} files are imported with their labels")
    # Checked here as well as in the writer so that a long first pass is not wasted.
    check_output(os.path.abspath(out), overwrite, out)
    declared = None if classes is None else DeclaredClasses(classes)
    encoding = None if encoding_from is None else Encoding.from_dataset(str(encoding_from))
    writer_options = {"rows_per_file": rows_per_file, "overwrite": overwrite, "declared": declared}
    request = ImportRequest(source, out, format, n_features, label, features, list(categorical or ()), encoding,
                            writer_options, unlabeled)
    if format == "images":  # its options live in its own module, which loads Pillow
        from shoal.data.importers.images import image_request

        request = image_request(request, size, color)
    IMPORTERS[format].load()(request)
    return open_dataset(out)


def _check_format_options(
    source: str, format: str, features: str | None, categorical: Sequence[str] | None, encoding_from: str | None
) -> None:
    """Options that apply to some formats only: one-hot encoding to tables, `features` to HDF5."""
    if (categorical or encoding_from is not None) and not IMPORTERS[format].table:
        raise DataError(f"{source}: categorical columns and encoding_from apply to {' and '.join(TABLE_FORMATS)}, "
                        f"not {format}")
    if categorical and encoding_from is not None:
        raise DataError(f"{source}: give categorical columns or encoding_from, not both "
                        "(the reference encoding names its categorical columns)")
    if features is not None and format != "hdf5":
        raise DataError(f"{source}: features names an HDF5 dataset; it does not apply to {format}")


def _check_image_options(
    source: str, format: str, label: str | None, size: str | tuple[int, int] | None, color: str | None
) -> None:
    """`size` and `color` apply to images only; images take their labels from their folders."""
    if format != "images" and (size is not None or color is not None):
        raise DataError(f"{source}: size and color apply to a folder of images (format images), not {format}")
    if format == "images" and label is not None:
        raise DataError(f"{source}: an image's label is the name of its class subfolder; label does not apply")


def _check_folder(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: folder not found")
    if not os.path.isdir(path):
        raise DataError(f"{path}: not a folder (format images reads a folder holding one subfolder per class)")
