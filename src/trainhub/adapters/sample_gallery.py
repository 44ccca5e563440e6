"""Image grids of a dataset's samples (the PNG of ``trainhub debug --png``), drawn with Pillow.

The images come from the dataset the trial's records name (``source``): ``digits`` from
scikit-learn, ``mnist/t10k`` (or ``mnist/train``) from the control plane's data directory.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainhub.service.debugging import Tile

_COLUMNS = 5
_TILE_PX = 112
_CAPTION_PX = 30


def load_images(source: str, ids: Sequence[int], data_dir: Path | None) -> list[np.ndarray]:
    """Grey images in [0, 1], one per id; ``LookupError`` for an unknown or absent dataset."""
    if source == "digits":
        from trainhub.data.digits import digit_images

        return [np.asarray(image, dtype=np.float64) / 16.0 for image in digit_images(list(ids))]
    if source.startswith("mnist/"):
        from trainhub.data.mnist import mnist_images

        files = source.split("/", 1)[1]
        root = data_dir / "mnist" if data_dir is not None else None
        try:
            images = mnist_images(list(ids), root=root, files=files)
        except FileNotFoundError as exc:
            raise LookupError(str(exc)) from None
        except IndexError:
            raise LookupError(f"sample ids beyond the {source} files") from None
        return [image.astype(np.float64) / 255.0 for image in images]
    raise LookupError(f"no images known for dataset {source!r} (known: digits, mnist/...)")


def render_grid(images: Sequence[np.ndarray], captions: Sequence[tuple[str, str]]) -> bytes:
    """A PNG grid: each image scaled to a tile, two caption lines below it."""
    from PIL import Image, ImageDraw, ImageFont

    rows = max(1, -(-len(images) // _COLUMNS))
    width = _COLUMNS * _TILE_PX
    height = rows * (_TILE_PX + _CAPTION_PX)
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    for k, (image, (line1, line2)) in enumerate(zip(images, captions, strict=True)):
        x0 = (k % _COLUMNS) * _TILE_PX
        y0 = (k // _COLUMNS) * (_TILE_PX + _CAPTION_PX)
        pixels = (255 * (1.0 - np.clip(image, 0.0, 1.0))).astype(np.uint8)  # dark ink on white
        tile = Image.fromarray(pixels, "L").resize(
            (_TILE_PX - 8, _TILE_PX - 8), Image.Resampling.NEAREST
        )
        canvas.paste(tile, (x0 + 4, y0 + 4))
        draw.text((x0 + 4, y0 + _TILE_PX - 2), line1, fill=(200, 0, 0), font=font)
        draw.text((x0 + 4, y0 + _TILE_PX + 12), line2, fill=(60, 60, 60), font=font)
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()


class DatasetGallery:
    """:class:`~trainhub.service.debugging.SampleGallery` over trainhub's datasets."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir = data_dir

    def grid_png(self, source: str, tiles: Sequence[Tile]) -> bytes:
        images = load_images(source, [t.sample_id for t in tiles], self.data_dir)
        captions = [
            (f"given {t.given} -> {t.suggested}", f"#{t.sample_id} score {t.score:.2f}")
            for t in tiles
        ]
        return render_grid(images, captions)
