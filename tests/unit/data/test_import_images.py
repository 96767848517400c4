"""Format images: a folder of class subfolders, imported pixel for pixel as uint8 [C, H, W], and clean failures.

The images are tiny files each test writes with Pillow. Every failure goes through the command
line: one line naming what the user gave, exit status 2, and nothing left where the dataset would go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shoal.data.importers import import_dataset
from tests.unit.data.test_import_cli import fails_cleanly, run_import
from tests.unit.data.test_importers import import_fails, read_back


def save(path: Path, pixels: np.ndarray, **options) -> Path:
    """An image file of `pixels` ((H, W) grey or (H, W, 3) RGB uint8), its format from its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, **options)
    return path


def grey(value: int, height: int = 4, width: int = 5) -> np.ndarray:
    """A (height, width) grey image whose pixels count up from `value`, so each image and position differs."""
    return (value + np.arange(height * width).reshape(height, width)).astype(np.uint8)


@pytest.fixture
def out(tmp_path):
    return tmp_path / "datasets" / "out"


def test_grey_images_import_pixel_for_pixel_with_classes_sorted_by_name(tmp_path, out):
    source = tmp_path / "images"
    expected = {}
    for offset, name in ((100, "zebra"), (0, "ant"), (50, "moth")):
        for number in range(3):
            expected[(name, number)] = save(source / name / f"{number}.png", grey(offset + 10 * number))
    dataset = import_dataset(str(source), str(out), "images")
    assert dataset.shape == (1, 4, 5) and str(dataset.feature_dtype) == "uint8"
    assert dataset.classes == ["ant", "moth", "zebra"]
    features, labels, _ = read_back(out)
    assert labels.tolist() == ["ant"] * 3 + ["moth"] * 3 + ["zebra"] * 3
    assert dataset.read_all()[1].tolist() == [0] * 3 + [1] * 3 + [2] * 3  # class i of the sorted names: label i
    for row, (name, number) in enumerate(sorted(expected)):
        offset = {"ant": 0, "moth": 50, "zebra": 100}[name]
        assert np.array_equal(features[row, 0], grey(offset + 10 * number))
    source_meta = dataset.meta["source"]
    assert source_meta["format"] == "images" and source_meta["color"] == "grey" and source_meta["size"] == [4, 5]


def test_colour_images_are_stored_channel_first_and_rgb_by_default(tmp_path, out):
    source = tmp_path / "images"
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)
    pixels[0, 2] = (200, 100, 50)  # row 0, column 2
    save(source / "a" / "grey.png", np.full((2, 3), 7, dtype=np.uint8))
    save(source / "b" / "colour.bmp", pixels)
    dataset = import_dataset(str(source), str(out), "images")
    assert dataset.shape == (3, 2, 3)
    features, labels, _ = read_back(out)
    assert labels.tolist() == ["a", "b"]
    assert np.array_equal(features[0], np.full((3, 2, 3), 7))  # a grey image, in three equal channels
    assert features[1, :, 0, 2].tolist() == [200, 100, 50] and features[1].sum() == 350


def test_color_grey_turns_colour_into_luma_and_size_resizes_height_by_width(tmp_path, out):
    source = tmp_path / "images"
    save(source / "red" / "big.png", np.tile(np.array([255, 0, 0], dtype=np.uint8), (12, 20, 1)))
    save(source / "white" / "small.jpg", np.full((3, 3, 3), 255, dtype=np.uint8), quality=100)
    dataset = import_dataset(str(source), str(out), "images", size="6x10", color="grey")
    assert dataset.shape == (1, 6, 10)
    features, _, _ = read_back(out)
    assert np.all(features[0] == 76)  # ITU-R 601-2 luma of pure red: 255 * 299 / 1000
    assert np.all(features[1] >= 250)
    assert dataset.meta["source"]["resized"] is True


def test_sixteen_bit_grey_is_scaled_to_eight_bits_not_clipped(tmp_path, out):
    source = tmp_path / "images"
    save(source / "a" / "wide.png", np.array([[0, 257, 1000, 65535]], dtype=np.uint16))
    import_dataset(str(source), str(out), "images")
    features, _, _ = read_back(out)
    assert features[0, 0, 0].tolist() == [0, 1, 4, 255]


def test_palette_images_are_grey_unless_their_palette_holds_a_colour(tmp_path):
    for name in ("grey", "colour"):
        (tmp_path / name / "a").mkdir(parents=True)
    Image.fromarray(grey(0)).convert("P").save(tmp_path / "grey" / "a" / "x.png")
    assert import_dataset(str(tmp_path / "grey"), str(tmp_path / "out1"), "images").shape == (1, 4, 5)
    assert np.array_equal(read_back(tmp_path / "out1")[0][0, 0], grey(0))
    red = np.zeros((4, 5, 3), dtype=np.uint8)
    red[0, 0] = (255, 0, 0)
    Image.fromarray(red).convert("P", palette=Image.Palette.ADAPTIVE).save(tmp_path / "colour" / "a" / "x.png")
    dataset = import_dataset(str(tmp_path / "colour"), str(tmp_path / "out2"), "images")
    assert dataset.shape == (3, 4, 5)
    assert read_back(tmp_path / "out2")[0][0, :, 0, 0].tolist() == [255, 0, 0]


def test_hidden_entries_and_other_files_are_left_out_and_nested_folders_read(tmp_path, out):
    source = tmp_path / "images"
    save(source / "a" / "1.PNG", grey(1))
    save(source / "a" / "deeper" / "2.jpeg", grey(0), quality=100)
    save(source / "a" / ".hidden.png", grey(3))
    save(source / ".checkpoints" / "4.png", grey(4))
    (source / "a" / "notes.txt").write_text("not an image")
    (source / "README").write_text("about these images")
    dataset = import_dataset(str(source), str(out), "images")
    assert dataset.rows == 2 and dataset.classes == ["a"]
    features, _, _ = read_back(out)
    assert np.array_equal(features[0, 0], grey(1))  # the class folder's own files come before a folder below it


def test_declared_classes_and_n_features_are_checked(tmp_path, out):
    source = tmp_path / "images"
    save(source / "cat" / "1.png", grey(0))
    save(source / "emu" / "2.png", grey(0))
    import_fails(source, out, "images", f"^{source / 'emu' / '2.png'}: label 'emu' is not one of the declared "
                 "classes cat, dog$", classes=["cat", "dog"])
    import_fails(source, out, "images", r"images have 20 features \(shape \[1, 4, 5\]\), but n_features=21",
                 n_features=21)


def test_a_test_folder_lacking_a_class_keeps_the_declared_classes_labels(tmp_path, out):
    """A small test split without one class: with --classes its labels stay those of the training set's classes."""
    source = tmp_path / "images"
    save(source / "cat" / "1.png", grey(0))
    save(source / "emu" / "2.png", grey(3))
    dataset = import_dataset(str(source), str(out), "images", classes=["cat", "dog", "emu"])
    assert list(dataset.classes) == ["cat", "dog", "emu"]
    assert dataset.read_all()[1].tolist() == [0, 2]  # emu is class 2, as in a training folder of all three


def test_the_command_line_imports_a_folder(tmp_path, capsys, out):
    source = tmp_path / "images"
    save(source / "a" / "1.png", grey(0))
    save(source / "b" / "1.png", grey(9, 5, 4))
    code, stdout, stderr = run_import(capsys, source, out, "--format", "images", "--size", "8x8", "--color", "rgb")
    assert (code, stderr) == (0, "")
    assert stdout == f"{out}: 2 rows, sample shape [3, 8, 8], classes ['a', 'b']\n"


def test_images_of_different_sizes_need_a_size(tmp_path, capsys, out):
    source = tmp_path / "images"
    save(source / "a" / "1.png", grey(0))
    save(source / "a" / "2.png", grey(0))
    save(source / "b" / "1.png", grey(0, 6, 5))
    fails_cleanly(capsys, source, out, ["--format", "images"],
                  f"{source / 'b' / '1.png'}: 6x5 pixels (HxW), but {source / 'a' / '1.png'} is 4x5: "
                  "give a size (--size HxW) to resize every image to it")


def test_a_file_pillow_cannot_read_names_it(tmp_path, capsys, out):
    source = tmp_path / "images"
    save(source / "a" / "1.png", grey(0))
    (source / "b").mkdir()
    (source / "b" / "1.png").write_text("a text file with an image's name")
    fails_cleanly(capsys, source, out, ["--format", "images"],
                  f"{source / 'b' / '1.png'}: not an image Pillow can read")


def test_an_image_cut_short_fails_when_decoded_and_leaves_nothing(tmp_path, capsys, out):
    source = tmp_path / "images"
    save(source / "a" / "1.png", grey(0))
    whole = save(source / "b" / "1.png", np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8))
    whole.write_bytes(whole.read_bytes()[:-400])  # the header reads; the pixels do not
    code, stdout, stderr = run_import(capsys, source, out, "--format", "images", "--size", "64x64")
    assert code == 2 and stdout == ""
    assert stderr.startswith(f"shoal: error: {source / 'b' / '1.png'}: cannot read the image: ")
    assert stderr.count("\n") == 1
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


@pytest.mark.parametrize("layout, options, message", [
    ({}, [], "{source}: an empty folder: expected one subfolder of images per class"),
    ({"1.txt": "a"}, [], "{source}: no class subfolders: expected one subfolder of images per class, named after "
                         "the class"),
    ({"a/1.png": None, "2.png": None}, [], "{source}/2.png: an image outside the class subfolders "
                                           "(expected {source}/<class>/2.png)"),
    ({"a/1.png": None, "b/notes.txt": "a"}, [], "{source}/b: holds no images (.png, .jpg, .jpeg, .bmp, .webp): "
                                                "every class subfolder needs at least one"),
    ({"a/1.png": None}, ["--size", "16"], "size: expected HxW (height x width in pixels, such as 32x32), got '16'"),
    ({"a/1.png": None}, ["--size", "0x4"], "size: '0x4': each side at least 1 pixel, at most 89,478,485 pixels"),
    ({"a/1.png": None}, ["--label", "y"], "{source}: an image's label is the name of its class subfolder; label "
                                          "does not apply"),
    ({"a/1.png": None}, ["--unlabeled"], "{source}: unlabeled: features alone, from npy, csv, parquet (no label "
                                         "or classes); images files are imported with their labels"),
])
def test_bad_folders_and_options(tmp_path, capsys, out, layout, options, message):
    source = tmp_path / "images"
    source.mkdir()
    for name, text in layout.items():
        if text is None:
            save(source / name, grey(0))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_text(text)
    fails_cleanly(capsys, source, out, ["--format", "images", *options], message.format(source=source))


def test_a_file_as_the_folder_and_image_options_on_other_formats(tmp_path, capsys, out):
    table = tmp_path / "table.csv"
    table.write_text("a,y\n1,0\n")
    fails_cleanly(capsys, table, out, ["--format", "images"],
                  f"{table}: not a folder (format images reads a folder holding one subfolder per class)")
    fails_cleanly(capsys, tmp_path / "absent", out, ["--format", "images"], f"{tmp_path / 'absent'}: folder not found")
    fails_cleanly(capsys, table, out, ["--format", "csv", "--size", "4x4"],
                  f"{table}: size and color apply to a folder of images (format images), not csv")
