"""Make a few hundred captioned images out of a few dozen real photographs, deterministically.

An image-text source needs hundreds of samples of varied size (the cost of an image sample grows
with its patch count). The wheels ship about twenty photographs, so each one is cut into views:
the whole picture, its four quarters, its centre, then seeded random regions, each resized by a
seeded factor. Pixels are always real pixels of the photograph; the caption says which photograph,
which region and which output size ("Chelsea the cat, upper left quarter, 224x152"), so a model
could in principle learn the mapping. The random generator is seeded from the photograph's origin,
so adding a photograph does not change the crops of the others.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mdata.sources.images import pillow  # Pillow is the `images` extra, imported when used

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["CropSpec", "CaptionedImage", "decode_rgb", "plan_crops", "render_crop"]

_FIXED_VIEWS = (
    ("full image", (0.0, 0.0, 1.0, 1.0)),
    ("upper left quarter", (0.0, 0.0, 0.5, 0.5)),
    ("upper right quarter", (0.5, 0.0, 1.0, 0.5)),
    ("lower left quarter", (0.0, 0.5, 0.5, 1.0)),
    ("lower right quarter", (0.5, 0.5, 1.0, 1.0)),
    ("centre crop", (0.25, 0.25, 0.75, 0.75)),
)
_SCALES = (0.5, 0.75, 1.0, 1.25)
_MIN_SIDE = 32
_MAX_SIDE = 768
_JPEG_QUALITY = 85


@dataclass(frozen=True)
class CropSpec:
    """A region of a photograph (pixel box, right/bottom exclusive) and the size to resize it to."""

    view: str  # human words for the region, used in the caption
    box: tuple[int, int, int, int]  # left, top, right, bottom
    size: tuple[int, int]  # output width, height


@dataclass(frozen=True)
class CaptionedImage:
    """One sample of the caption source: JPEG bytes and their caption."""

    jpeg: bytes
    caption: str
    width: int
    height: int


def plan_crops(origin: str, width: int, height: int, count: int, *, seed: int = 0) -> list[CropSpec]:
    """The first ``count`` views of a ``width`` x ``height`` photograph, the same on every run.

    The fixed views come first, so a small corpus still shows every photograph whole.
    """
    rng = np.random.default_rng([seed, zlib.crc32(origin.encode("utf-8"))])
    specs: list[CropSpec] = []
    for i in range(count):
        if i < len(_FIXED_VIEWS):
            view, (fx0, fy0, fx1, fy1) = _FIXED_VIEWS[i]
            box = (round(fx0 * width), round(fy0 * height), round(fx1 * width), round(fy1 * height))
        else:
            crop_w = max(_MIN_SIDE, int(width * rng.uniform(0.25, 0.9)))
            crop_h = max(_MIN_SIDE, int(height * rng.uniform(0.25, 0.9)))
            crop_w, crop_h = min(crop_w, width), min(crop_h, height)
            left = int(rng.integers(0, width - crop_w + 1))
            top = int(rng.integers(0, height - crop_h + 1))
            box = (left, top, left + crop_w, top + crop_h)
            view = f"region x {box[0]}-{box[2]}, y {box[1]}-{box[3]} of {width}x{height}"
        scale = float(rng.choice(_SCALES))
        size = (_side(box[2] - box[0], scale), _side(box[3] - box[1], scale))
        specs.append(CropSpec(view, box, size))
    return specs


def render_crop(photo: Image.Image, spec: CropSpec, subject: str) -> CaptionedImage:
    """Cut, resize and JPEG-encode one view of a decoded RGB photograph, with its caption."""
    view = photo.crop(spec.box)
    if view.size != spec.size:
        view = view.resize(spec.size, pillow().Resampling.BICUBIC)
    buffer = io.BytesIO()
    view.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    width, height = spec.size
    return CaptionedImage(buffer.getvalue(), f"{subject}, {spec.view}, {width}x{height}", width, height)


def decode_rgb(data: bytes) -> Image.Image:
    """Decode a PNG/JPEG to RGB; transparency (the horse silhouette) is flattened onto white."""
    Image = pillow()
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        if image.mode in ("RGBA", "LA", "P"):
            image = image.convert("RGBA")
            background = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, image).convert("RGB")
        return image.convert("RGB")


def _side(pixels: int, scale: float) -> int:
    # Multiples of 8 keep JPEG blocks whole; clamp so a tiny crop stays visible and a huge one bounded.
    side = int(round(pixels * scale / 8.0)) * 8
    return int(min(_MAX_SIDE, max(_MIN_SIDE, side)))
