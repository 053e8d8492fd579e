"""DETR's outputs to labelled boxes, the same function in the pipeline's Python model and in the in-process
pipeline: per image the most confident queries (the "no object" class left out), each as
"label score cx cy w h" (box centre and size as fractions of the image)."""

from __future__ import annotations

import numpy as np

TOP = 5


def detections(logits: np.ndarray, boxes: np.ndarray, top: int = TOP) -> np.ndarray:
    """logits [N, queries, classes], boxes [N, queries, 4] -> object array [N, top] of bytes."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities = (shifted / shifted.sum(axis=-1, keepdims=True))[..., :-1]
    scores, classes = probabilities.max(axis=-1), probabilities.argmax(axis=-1)
    out = np.empty((len(logits), top), dtype=object)
    for i in range(len(logits)):
        best = np.argsort(-scores[i])[:top]
        out[i] = [
            f"class_{classes[i, q]} {scores[i, q]:.3f} {' '.join(f'{v:.3f}' for v in boxes[i, q])}".encode()
            for q in best
        ]
    return out
