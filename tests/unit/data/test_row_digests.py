"""Block digests of a dataset's rows: the blocks follow the row groups, a digest does not depend on how the rows
were cut into batches but changes with any byte of a block's features or labels, and a checked stream gives no
row of a block before the block matched (the servers that use them: tests/unit/data/test_flight_trust.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shoal.data.format import DatasetWriter, open_dataset
from shoal.data.row_digests import (
    CheckedRows,
    RowsDiffer,
    block_bounds,
    dataset_digests,
    label_bytes,
    starting,
    widened,
)

BOUNDS = np.array([0, 4, 8, 10, 14, 15])
"""Row groups of 10 and 5 rows cut into blocks of 4 rows."""


def rows(count: int = 15, seed: int = 0) -> tuple[np.ndarray, pa.Array]:
    features = np.random.default_rng(seed).standard_normal((count, 3)).astype(np.float32)
    return features, pa.array(["x" * (row % 4) + str(row) for row in range(count)])


def cut(features: np.ndarray, labels: pa.Array, at: list[int]):
    edges = [0, *at, len(features)]
    return [(features[a:b], labels.slice(a, b - a)) for a, b in zip(edges, edges[1:], strict=False)]


def test_the_blocks_follow_the_row_groups(tmp_path):
    with DatasetWriter(str(tmp_path / "set"), (2**15,), np.float32, rows_per_file=10, row_group_size=5) as writer:
        writer.write(np.zeros((23, 2**15), np.float32), np.arange(23) % 2)  # rows of 128 KiB: two to a block
    bounds = block_bounds(open_dataset(str(tmp_path / "set")))
    assert bounds.tolist() == [0, 2, 4, 5, 7, 9, 10, 12, 14, 15, 17, 19, 20, 22, 23]
    assert widened(bounds, 3, 11) == (2, 12) and widened(bounds, 4, 5) == (4, 5) and widened(bounds, 22, 23) == (22, 23)
    assert starting(bounds, 3, 11) == slice(2, 7) and starting(bounds, 22, 23) == slice(13, 14)


def test_a_digest_does_not_depend_on_where_the_batches_were_cut():
    features, labels = rows()
    whole = dataset_digests(BOUNDS, [(features, labels)])
    assert len(whole) == 5 * 32
    for at in ([1, 2, 3, 9], [4, 8], [7], list(range(1, 15))):
        assert dataset_digests(BOUNDS, cut(features, labels, at)) == whole
    assert dataset_digests(BOUNDS, cut(features, labels.cast(pa.large_string()), [6])) == whole


def test_any_changed_byte_changes_its_blocks_digest_only():
    features, labels = rows()
    whole = dataset_digests(BOUNDS, [(features, labels)])
    altered = features.copy()
    altered.view(np.uint8)[9, 5] ^= 1
    text = labels.to_pylist()
    text[12] = text[12][:-1] + "x"
    moved = labels.to_pylist()
    moved[5], moved[6] = moved[5] + moved[6][:1], moved[6][1:]  # the same bytes, cut elsewhere
    for changed, block in (((altered, labels), 2), ((features, pa.array(text)), 3), ((features, pa.array(moved)), 1)):
        digests = dataset_digests(BOUNDS, [changed])
        differ = [k for k in range(5) if digests[32 * k: 32 * k + 32] != whole[32 * k: 32 * k + 32]]
        assert differ == [block]


def test_numbers_and_text_label_bytes():
    assert bytes(label_bytes(pa.array([1, 2], pa.int64()))[0]) == np.array([1, 2], "<i8").tobytes()
    sliced = pa.array(["a", "bc", "", "def"]).slice(1, 3)
    lengths, text = label_bytes(sliced)
    assert lengths.tolist() == [2, 0, 3] and bytes(text) == b"bcdef"
    with pytest.raises(ValueError, match="empty values"):
        label_bytes(pa.array([1, None]))


def test_a_checked_stream_holds_a_blocks_rows_until_the_block_matched():
    features, labels = rows()
    whole = dataset_digests(BOUNDS, [(features, labels)])
    digests = [whole[32 * k: 32 * k + 32] for k in range(5)]
    checked = CheckedRows(BOUNDS, 4)
    assert list(checked.add(features[4:6], labels.slice(4, 2), digests[1:2])) == []  # block [4, 8) incomplete
    given = list(checked.add(features[6:11], labels.slice(6, 5), digests[2:4]))  # blocks [4, 8), [8, 10) done
    assert [(row, len(block)) for row, block, _ in given] == [(4, 2), (6, 4)]
    np.testing.assert_array_equal(np.concatenate([block for _, block, _ in given]), features[4:10])
    assert [value for _, _, label in given for value in label] == labels.slice(4, 6).to_pylist()
    flipped = labels.to_pylist()
    flipped[12] = "another"
    with pytest.raises(RowsDiffer, match="^rows 11 to 14$"):
        list(checked.add(features[11:14], pa.array(flipped[11:14]), []))
    with pytest.raises(RowsDiffer):  # digests for blocks that do not begin in the rows
        CheckedRows(BOUNDS, 0).add(features[:2], labels.slice(0, 2), digests[:2])
    with pytest.raises(ValueError, match="does not begin a block"):
        CheckedRows(BOUNDS, 3)


def test_files_that_hold_other_rows_than_meta_lists_have_no_digests():
    features, labels = rows()
    with pytest.raises(ValueError, match="the files hold 14 rows, not the 15 meta.json lists"):
        dataset_digests(BOUNDS, [(features[:14], labels.slice(0, 14))])
    with pytest.raises(ValueError, match="the files hold more rows than the 14 meta.json lists"):
        dataset_digests(BOUNDS[:-1], [(features, labels)])
