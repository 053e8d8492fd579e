"""The shared server's three models, built locally: the fraud model trained on synthetic transactions, the
recommender and ResNet-50 with random weights (only the cost of inference matters)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

FRAUD_FEATURES = 256
FRAUD_TREES, FRAUD_DEPTH = 500, 8
DENSE_FEATURES = 13  # the Criteo layout DLRM was made for: 13 counts, 26 categorical fields
# Embedding rows per categorical field, about 1M in all, skewed as real fields are (a few large, many small).
TABLE_ROWS = [300_000, 200_000, 150_000, 100_000, 80_000, 60_000, 40_000, 20_000, 15_000, 10_000] + [1_500] * 16
EMBEDDING_DIM = 64
CANDIDATES = 64  # items one recommendation request ranks


def train_fraud(path: Path) -> Path:
    if path.exists():
        return path
    import xgboost as xgb

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((50_000, FRAUD_FEATURES)).astype(np.float32)
    signal = rows[:, 0] + rows[:, 1] * rows[:, 2] - 0.5 * rows[:, 3] ** 2 + 0.3 * rows[:, 4:20].sum(axis=1)
    labels = (signal + rng.standard_normal(len(rows)) > 1.5).astype(np.float32)  # a rare positive class, as fraud is
    params = {
        "objective": "binary:logistic",
        "max_depth": FRAUD_DEPTH,
        "eta": 0.05,
        "tree_method": "hist",
        "nthread": os.cpu_count(),
    }
    booster = xgb.train(params, xgb.DMatrix(rows, label=labels), num_boost_round=FRAUD_TREES)
    booster.save_model(str(path))
    return path


class Recommender(nn.Module):
    """DLRM's shape: a bottom MLP over the dense features, one embedding per categorical field, the pairwise dot
    products of all of them, and a top MLP to a click probability."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(
            nn.Linear(DENSE_FEATURES, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, EMBEDDING_DIM),
            nn.ReLU(),
        )
        self.tables = nn.ModuleList(nn.Embedding(rows, EMBEDDING_DIM) for rows in TABLE_ROWS)
        fields = len(TABLE_ROWS) + 1
        pairs = fields * (fields - 1) // 2
        self.top = nn.Sequential(
            nn.Linear(EMBEDDING_DIM + pairs, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
            nn.Sigmoid(),
        )
        self.register_buffer("upper", torch.triu_indices(fields, fields, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.stack([x] + [table(sparse[:, i]) for i, table in enumerate(self.tables)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([x, dots], dim=1))


def export_recommender(path: Path) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Recommender().eval()
    dense, sparse = recommender_request(np.random.default_rng(0))
    partial = path.with_suffix(".partial")
    torch.onnx.export(
        model, (torch.from_numpy(dense), torch.from_numpy(sparse)), str(partial), input_names=["DENSE", "SPARSE"],
        output_names=["SCORE"], dynamic_axes={"DENSE": {0: "batch"}, "SPARSE": {0: "batch"}, "SCORE": {0: "batch"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    partial.rename(path)
    return path


def recommender_request(rng: np.random.Generator, rows: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
    """One request's candidates: log-scaled counts, and ids drawn with a popularity skew (Zipf-like) per field."""
    dense = np.log1p(rng.exponential(10.0, (rows, DENSE_FEATURES))).astype(np.float32)
    sparse = np.stack([np.minimum(rng.zipf(1.2, rows) - 1, size - 1) for size in TABLE_ROWS], axis=1).astype(np.int64)
    return dense, sparse
