"""Import of a folder of images kept as torchvision's ImageFolder keeps them: one subfolder per class.

`DIR/<class>/<file>.png` (or .jpg, .jpeg, .bmp, .webp; in any folder below the class's): the
class names, sorted, are the dataset's classes, so class `i` of the sorted names is label `i`,
as in ImageFolder. Hidden entries and files of other kinds are left out; an image directly in
`DIR`, outside every class, is refused rather than dropped. Each image is stored as uint8 with
sample shape [C, H, W] (C 1 for grey, 3 for RGB), which a conv2d layer reads as it is and the
loader scales to [0, 1] as it does every uint8 dataset. A first pass reads only the headers
(size, pixel mode), so images of different sizes without `size`, or a file that is no image,
fail before anything is decoded; the second decodes a chunk of images at a time.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np
from PIL import Image, UnidentifiedImageError

from shoal.data.importers.common import ImportRequest, import_writer, rows_per_chunk, source_meta
from shoal.errors import DataError, first_line

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
COLORS = ("grey", "rgb")
GREY_MODES = {"1", "L", "LA", "La"}
WIDE_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N"}  # 16-bit grey (PNG): scaled to 8 bits, not clipped
COLOR_MODES = {"RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}
PALETTE_MODES = {"P", "PA"}
WIDE_SCALE = 65535 / 255
SIZE_PATTERN = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")


@dataclass(frozen=True)
class ImageRequest(ImportRequest):
    """An `ImportRequest` with the image options: the size to resize to (height, width), and the color."""

    size: tuple[int, int] | None = None  # None: every image must already share one size
    color: str | None = None  # grey or rgb; None: rgb if any image is stored in colour


def image_request(request: ImportRequest, size: str | tuple[int, int] | None, color: str | None) -> ImageRequest:
    """`request` with the image options, checked: `size` as `HxW` text or a (height, width) pair."""
    if color is not None and color not in COLORS:
        raise DataError(f"color: expected {' or '.join(COLORS)}, got {color!r}")
    given = {field.name: getattr(request, field.name) for field in fields(request)}
    return ImageRequest(**given, size=None if size is None else parse_size(size), color=color)


def parse_size(size: str | tuple[int, int]) -> tuple[int, int]:
    """`16x24` (or a pair) as (height 16, width 24); a bad size is a `DataError` naming what was given."""
    match = SIZE_PATTERN.fullmatch(size) if isinstance(size, str) else None
    if match:
        height, width = int(match[1]), int(match[2])
    elif isinstance(size, tuple | list) and len(size) == 2 and all(type(side) is int for side in size):
        height, width = size
    else:
        raise DataError(f"size: expected HxW (height x width in pixels, such as 32x32), got {size!r}")
    if height < 1 or width < 1 or height * width > Image.MAX_IMAGE_PIXELS:
        raise DataError(f"size: {size!r}: each side at least 1 pixel, at most {Image.MAX_IMAGE_PIXELS:,} pixels")
    return height, width


@dataclass(frozen=True)
class Picture:
    """One image file and its class (the name of the subfolder of the source it lies in)."""

    path: str
    label: str


def import_file(request: ImageRequest) -> None:
    source = request.source
    pictures = find_pictures(source)
    size, colored = survey(pictures, request.size)
    color = request.color or ("rgb" if colored else "grey")
    shape = (3 if color == "rgb" else 1, *size)
    if request.n_features is not None and request.n_features != math.prod(shape):
        raise DataError(f"{source}: images have {math.prod(shape)} features (shape {list(shape)}), "
                        f"but n_features={request.n_features}")
    declared = request.writer_options.get("declared")  # --classes: every one of them, found here or not
    classes = sorted({picture.label for picture in pictures} | set(declared.text if declared else ()))
    meta = source_meta("images", source, color=color, size=list(size), resized=request.size is not None)
    rows = rows_per_chunk(shape, np.dtype(np.uint8))
    with import_writer(request.out, shape, np.uint8, request.writer_options, locate=lambda row: pictures[row].path,
                       extra_meta=meta, classes=classes) as writer:
        for start in range(0, len(pictures), rows):
            chunk = pictures[start : start + rows]
            images = np.stack([pixels(picture.path, color, size) for picture in chunk])
            writer.write(images, np.array([picture.label for picture in chunk]))


def find_pictures(source: str) -> list[Picture]:
    """Every image of every class, classes in sorted order and, within one, in ImageFolder's order."""
    entries = sorted((entry for entry in _listing(source) if not entry.name.startswith(".")),
                     key=lambda entry: entry.name)
    if not entries:
        raise DataError(f"{source}: an empty folder: expected one subfolder of images per class")
    folders = [entry for entry in entries if entry.is_dir()]
    loose = [entry for entry in entries if not entry.is_dir() and entry.name.lower().endswith(EXTENSIONS)]
    if loose:
        raise DataError(f"{os.path.join(source, loose[0].name)}: an image outside the class subfolders "
                        f"(expected {os.path.join(source, '<class>', loose[0].name)})")
    if not folders:
        raise DataError(f"{source}: no class subfolders: expected one subfolder of images per class, "
                        "named after the class")
    pictures = []
    for folder in folders:
        found = [Picture(path, folder.name) for path in _images_under(os.path.join(source, folder.name))]
        if not found:
            raise DataError(f"{os.path.join(source, folder.name)}: holds no images ({', '.join(EXTENSIONS)}): "
                            "every class subfolder needs at least one")
        pictures += found
    return pictures


def _listing(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as error:
        raise DataError(f"{folder}: cannot read the folder: {error.strerror or error}") from None


def _images_under(folder: str) -> Iterator[str]:
    """The image files in `folder` and the folders below it, in ImageFolder's order (by folder, then name)."""

    def refuse(error: OSError) -> None:  # os.walk would skip a folder it cannot read: its images would be missing
        raise DataError(f"{error.filename or folder}: cannot read the folder: {error.strerror or error}")

    walked = []
    for root, folders, files in os.walk(folder, onerror=refuse):
        folders[:] = [name for name in folders if not name.startswith(".")]
        walked.append((root, [name for name in files
                              if not name.startswith(".") and name.lower().endswith(EXTENSIONS)]))
    for root, files in sorted(walked):
        yield from (os.path.join(root, name) for name in sorted(files))


def survey(pictures: list[Picture], size: tuple[int, int] | None) -> tuple[tuple[int, int], bool]:
    """The (height, width) every image will have, and whether any is stored in colour; only headers are read."""
    first, colored = None, False
    for picture in pictures:
        with opened(picture.path) as image:
            width, height = image.size
            colored = colored or _in_color(picture.path, image)
        if first is None:
            first = (picture.path, (height, width))
        elif size is None and (height, width) != first[1]:
            raise DataError(f"{picture.path}: {height}x{width} pixels (HxW), but {first[0]} is "
                            f"{first[1][0]}x{first[1][1]}: give a size (--size HxW) to resize every image to it")
    return size or first[1], colored


def _in_color(path: str, image: Image.Image) -> bool:
    """Whether the image is stored in colour: a colour mode, or a palette holding a colour."""
    if image.mode in GREY_MODES | WIDE_MODES:
        return False
    if image.mode in COLOR_MODES:
        return True
    if image.mode in PALETTE_MODES:
        palette = np.asarray(image.getpalette() or [], dtype=np.uint8).reshape(-1, 3)
        return bool(np.any(palette != palette[:, :1]))
    raise DataError(f"{path}: pixel mode {image.mode!r} is not one shoal imports (8-bit grey, colour or palette "
                    "images, 16-bit grey)")


@contextmanager
def opened(path: str) -> Iterator[Image.Image]:
    """The image at `path`, opened by Pillow; a file it cannot read is one `DataError` naming it."""
    try:
        with Image.open(path) as image:
            yield image
    except UnidentifiedImageError:
        raise DataError(f"{path}: not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as error:
        raise DataError(f"{path}: cannot read the image: {first_line(error)}") from None


def pixels(path: str, color: str, size: tuple[int, int]) -> np.ndarray:
    """The image at `path` as uint8 [C, H, W]: converted to `color`, resized to `size` (height, width) if it differs."""
    with opened(path) as image:
        image.load()
        if image.mode in WIDE_MODES:  # Pillow's own conversion clips 16-bit values at 255
            wide = np.asarray(image, dtype=np.float64) / WIDE_SCALE
            image = Image.fromarray(np.clip(np.rint(wide), 0, 255).astype(np.uint8))
        image = image.convert("L" if color == "grey" else "RGB")
        if image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        values = np.asarray(image, dtype=np.uint8)
    return values[None] if color == "grey" else values.transpose(2, 0, 1)
