"""Image decoding for image-text sources: header check, fast JPEG draft, patch-aligned resize.

The decoder works in the order that bounds its cost: read only the header and reject an image whose
pixel count exceeds the limit *before* decoding it (a 20,000 x 20,000 PNG would otherwise take
1.2 GB and seconds of CPU), then let libjpeg decode at a reduced DCT scale when the target is much
smaller than the original (``Image.draft``: several times faster for photos), then resize to a size
whose sides are multiples of the patch size and whose patch count fits the budget, so the vision
encoder's token count (``num_patches``) is known exactly at load time.

Pillow is the ``images`` extra, imported on the first decode, so text-only processes go without it.
"""

from __future__ import annotations

import io
import math

import numpy as np

from mdata.distribution import install_hint

__all__ = ["ImageProblem", "decode_image", "fit_patches", "pillow"]

#: Formats the decoder accepts; anything else is rejected from the header, without a decode attempt.
FORMATS = ("JPEG", "PNG", "WEBP")

#: EXIF orientation -> the ``Image.Transpose`` that shows the image upright (as ImageOps.exif_transpose).
_ORIENT = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_270",
    7: "TRANSVERSE",
    8: "ROTATE_90",
}
#: EXIF orientations that rotate by 90 degrees (swap height and width).
_TRANSPOSED = {5, 6, 7, 8}


def pillow():
    """``PIL.Image``; an ``ImportError`` that says which extra installs it when Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(f"decoding images needs Pillow, which is not installed: {install_hint('images')}") from None
    return Image


class ImageProblem(ValueError):
    """An image cannot be used; carries a hint. Transforms turn it into ``ImageDecodeError``."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def fit_patches(height: int, width: int, patch_size: int, max_patches: int) -> tuple[int, int]:
    """Target ``(height, width)``: multiples of ``patch_size``, aspect kept, at most ``max_patches``.

    The image is never enlarged beyond its own size except to reach one whole patch per side.
    """
    gh, gw = height / patch_size, width / patch_size
    scale = min(1.0, math.sqrt(max_patches / (gh * gw)))
    nh = max(1, math.floor(gh * scale))
    nw = max(1, math.floor(gw * scale))
    # Very elongated images: clamping the short side to one patch can exceed the budget; then the
    # long side gives way. Floating error can also leave the product one patch over: fix it here.
    while nh * nw > max_patches:
        if nw >= nh:
            nw = max(1, max_patches // nh)
        else:
            nh = max(1, max_patches // nw)
    return nh * patch_size, nw * patch_size


def decode_image(
    data: bytes, *, patch_size: int, max_patches: int, max_pixels: int
) -> np.ndarray:
    """Decode JPEG/PNG/WebP ``data`` into an RGB ``(h, w, 3)`` uint8 array sized by :func:`fit_patches`.

    Raises :class:`ImageProblem` for unreadable, truncated, unsupported or too large images.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageProblem(
            f"image value is {type(data).__name__}, not bytes",
            "store encoded JPEG/PNG bytes in the image column",
        )
    Image = pillow()
    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        # Pillow's own limit (2 x Image.MAX_IMAGE_PIXELS, about 179 MPix) fires inside open().
        raise ImageProblem(
            f"{exc} (over max_pixels={max_pixels:,} too)",
            "the image is far too large; drop or downscale it",
        ) from None
    except Exception as exc:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError...
        raise ImageProblem(
            f"cannot read image header ({type(exc).__name__}: {exc})",
            f"the bytes are not a valid {'/'.join(FORMATS)} image",
        ) from None
    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise ImageProblem(
                f"image is {width}x{height} = {width * height:,} pixels, over max_pixels={max_pixels:,}",
                "raise max_pixels if such images are expected, or drop them from the shard",
            )
        try:
            orientation = im.getexif().get(0x0112, 1)
        except Exception:  # a broken EXIF block must not lose an otherwise good image
            orientation = 1
        if orientation in _TRANSPOSED:
            height, width = width, height
        th, tw = fit_patches(height, width, patch_size, max_patches)
        try:
            # JPEG: decode directly at a reduced DCT scale that is still >= the target size.
            im.draft("RGB", (th, tw) if orientation in _TRANSPOSED else (tw, th))
            rgb = im.convert("RGB")
            if orientation in _ORIENT:
                rgb = rgb.transpose(Image.Transpose[_ORIENT[orientation]])
            if rgb.size != (tw, th):
                rgb = rgb.resize((tw, th), Image.Resampling.BICUBIC)
            return np.asarray(rgb, dtype=np.uint8)
        except Exception as exc:  # truncated or corrupt pixel data
            raise ImageProblem(
                f"cannot decode image pixels ({type(exc).__name__}: {exc})",
                "the image data is truncated or corrupt; re-encode or drop it",
            ) from None
