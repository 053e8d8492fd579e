"""JPEG bytes to the network's input, the same function for every server and the in-process pipeline: decode
(PIL, with its DCT-domain downscaling to the nearest size above the target), resize to 224x224, scale and
normalise with ImageNet's mean and deviation, channels first. It is copied beside the Python model that
preprocesses on Nereid, and imported by the peers' servers."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def decode(jpeg: bytes, size: int = SIZE) -> np.ndarray:
    """One image as float32 [3, size, size]."""
    image = Image.open(io.BytesIO(jpeg))
    image.draft("RGB", (size, size))
    pixels = np.asarray(image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)
    return np.ascontiguousarray(((pixels - MEAN) / STD).transpose(2, 0, 1))


def decode_batch(jpegs: list[bytes]) -> np.ndarray:
    return np.stack([decode(j) for j in jpegs]) if jpegs else np.empty((0, 3, SIZE, SIZE), np.float32)


def sample_jpeg(width: int = 640, height: int = 480, seed: int = 0) -> bytes:
    """A photo-sized JPEG (quality 90) with smooth shapes and grain, so it compresses like a photo (tens of kB),
    not like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [
        127 + 80 * np.sin(x / (37 + 11 * c) + c) * np.cos(y / (53 - 7 * c)) + rng.normal(0, 6, (height, width))
        for c in range(3)
    ]
    pixels = np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()
