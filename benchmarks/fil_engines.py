"""Which engine should the fil backend run a tree model on? Times each candidate on the same model and rows
and checks that it gives the same numbers as the model's own framework; prints a markdown table.

    .venv/bin/python benchmarks/fil_engines.py [--trees 500 --depth 8 --features 32] [--out benchmarks/results/fil_engines.md]

Candidates: XGBoost `inplace_predict`, XGBoost `predict(DMatrix)`, LightGBM `predict`, Treelite GTIL (the
interpreter in the treelite wheel), and TL2cgen (the model compiled to C with gcc, loaded as a shared library).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

Predict = Callable[[np.ndarray], np.ndarray]


def _time(fn: Predict, rows: np.ndarray, budget_s: float) -> float:
    """Median seconds per call over repeated calls within the budget (after one warm-up)."""
    fn(rows)
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(samples) < 5:
        t0 = time.perf_counter()
        fn(rows)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _xgboost_model(trees: int, depth: int, features: int, seed: int) -> tuple[object, np.ndarray]:
    import xgboost as xgb

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((20_000, features)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + 0.5 * rng.standard_normal(len(x)) > 0).astype(np.float32)
    booster = xgb.train(
        {"objective": "binary:logistic", "max_depth": depth, "eta": 0.1, "tree_method": "hist", "nthread": os.cpu_count()},
        xgb.DMatrix(x, label=y),
        num_boost_round=trees,
    )
    return booster, x


def _lightgbm_model(trees: int, depth: int, features: int, seed: int) -> tuple[object, np.ndarray]:
    import lightgbm as lgb

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((20_000, features)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + 0.5 * rng.standard_normal(len(x)) > 0).astype(np.float32)
    params = {"objective": "binary", "max_depth": depth, "num_leaves": 2**depth, "learning_rate": 0.1, "verbose": -1}
    booster = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=trees)
    return booster, x


def _compiled(model: object, workdir: Path, name: str) -> tuple[Predict, float]:
    import tl2cgen  # not a dependency of Nereid: `pip install tl2cgen` to measure it (or pass --no-compile)

    library = workdir / f"{name}.so"
    t0 = time.perf_counter()
    tl2cgen.export_lib(model, toolchain="gcc", libpath=str(library), params={"parallel_comp": os.cpu_count() or 1})
    compile_s = time.perf_counter() - t0
    predictor = tl2cgen.Predictor(str(library), nthread=1)

    def predict(rows: np.ndarray) -> np.ndarray:
        return np.asarray(predictor.predict(tl2cgen.DMatrix(rows, dtype="float32"))).reshape(len(rows), -1)[:, -1]

    return predict, compile_s


def _gtil(model: object) -> Predict:
    import treelite

    def predict(rows: np.ndarray) -> np.ndarray:
        return np.asarray(treelite.gtil.predict(model, rows, nthread=1)).reshape(len(rows), -1)[:, -1]

    return predict


def measure(trees: int, depth: int, features: int, budget_s: float, compile_models: bool) -> list[str]:
    import lightgbm
    import treelite
    import xgboost as xgb

    lines = [
        f"Model: binary classifier, {trees} trees, max depth {depth}, {features} FP32 features. One OpenMP thread per "
        f"engine call (the 'rows split' row makes one such call per core at once). Median time per call; "
        f"`max |diff|` is against the framework's own `predict` on the same rows.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, xgboost "
        f"{xgb.__version__}, lightgbm {lightgbm.__version__}, treelite {treelite.__version__}.",
        "",
        "| model | engine | batch 1 (µs) | batch 1024 (ms) | rows/s at 1024 | max abs diff | load/compile (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        booster, x = _xgboost_model(trees, depth, features, seed=0)
        booster.set_param({"nthread": 1})
        rows1, rows1024 = x[:1].copy(), x[:1024].copy()
        reference = booster.predict(xgb.DMatrix(rows1024))
        xgb_path = workdir / "xgboost.json"
        booster.save_model(str(xgb_path))
        t0 = time.perf_counter()
        tl_model = treelite.frontend.load_xgboost_model(str(xgb_path))
        tl_load = time.perf_counter() - t0
        sys.path.insert(0, str(ROOT / "src"))
        from nereid.backends.fil.parallel import in_parts
        from nereid.backends.fil.xgboost_capi import DensePredictor

        dense = DensePredictor.create(booster, margin=False)
        assert dense is not None, "XGBoost's C API answered differently from inplace_predict"
        candidates: list[tuple[str, Predict, float]] = [
            ("xgboost inplace_predict", lambda r: booster.inplace_predict(r), 0.0),
            ("xgboost C API direct (fil backend)", dense.predict, 0.0),
            (f"xgboost C API direct, rows split over {os.cpu_count()} threads (fil backend)",
             lambda r: in_parts(dense.predict, r), 0.0),
            ("xgboost predict(DMatrix)", lambda r: booster.predict(xgb.DMatrix(r, nthread=1)), 0.0),
            ("treelite GTIL", _gtil(tl_model), tl_load),
        ]
        if compile_models:
            predict, compile_s = _compiled(tl_model, workdir, "xgb")
            candidates.append(("tl2cgen compiled (gcc)", predict, compile_s))
        lines += _rows("xgboost", candidates, rows1, rows1024, reference, budget_s)

        lgb_booster, x = _lightgbm_model(trees, depth, features, seed=1)
        rows1, rows1024 = x[:1].copy(), x[:1024].copy()
        reference = lgb_booster.predict(rows1024, num_threads=1)
        lgb_path = workdir / "model.txt"
        lgb_booster.save_model(str(lgb_path))
        t0 = time.perf_counter()
        tl_model = treelite.frontend.load_lightgbm_model(str(lgb_path))
        tl_load = time.perf_counter() - t0
        candidates = [
            ("lightgbm predict", lambda r: lgb_booster.predict(r, num_threads=1), 0.0),
            ("treelite GTIL", _gtil(tl_model), tl_load),
        ]
        if compile_models:
            predict, compile_s = _compiled(tl_model, workdir, "lgb")
            candidates.append(("tl2cgen compiled (gcc)", predict, compile_s))
        lines += _rows("lightgbm", candidates, rows1, rows1024, reference, budget_s)
    return lines


def _rows(
    model: str,
    candidates: list[tuple[str, Predict, float]],
    rows1: np.ndarray,
    rows1024: np.ndarray,
    reference: np.ndarray,
    budget_s: float,
) -> list[str]:
    lines = []
    for engine, predict, load_s in candidates:
        diff = float(np.max(np.abs(np.asarray(predict(rows1024), dtype=np.float64).reshape(-1) - reference.reshape(-1))))
        one = _time(predict, rows1, budget_s)
        batch = _time(predict, rows1024, budget_s)
        lines.append(
            f"| {model} | {engine} | {one * 1e6:.0f} | {batch * 1e3:.2f} | {1024 / batch:,.0f} | {diff:.1e} | {load_s:.1f} |"
        )
        print(lines[-1], file=sys.stderr)
    return lines


def thread_table(trees: int, depth: int, features: int, budget_s: float) -> list[str]:
    """XGBoost by batch size: inplace_predict on one thread and on an OpenMP pool of every core, against what the
    fil backend calls (the C API directly; from 256 rows, row ranges on every core, one thread each)."""
    sys.path.insert(0, str(ROOT / "src"))
    from nereid.backends.fil.parallel import in_parts
    from nereid.backends.fil.xgboost_capi import DensePredictor

    booster, x = _xgboost_model(trees, depth, features, seed=0)
    cores = os.cpu_count() or 1
    parallel = booster.copy()  # type: ignore[attr-defined]
    parallel.set_param({"nthread": cores})
    booster.set_param({"nthread": 1})  # type: ignore[attr-defined]
    dense = DensePredictor.create(booster, margin=False)
    assert dense is not None, "XGBoost's C API answered differently from inplace_predict"
    lines = [
        f"XGBoost, same model, by batch size (median µs per call): `inplace_predict` on 1 thread and on {cores} "
        f"OpenMP threads; the fil backend's call (XGBoost's C API directly, 1 thread); and the fil backend's call "
        f"split by rows over {cores} Python threads of 1 OpenMP thread each (parallel.in_parts).",
        "",
        f"| batch | inplace_predict 1 thread | inplace_predict {cores} threads | C API direct | C API direct, rows split |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in (1, 8, 16, 64, 256, 1024):
        rows = x[:size].copy()
        reference = booster.inplace_predict(rows)  # type: ignore[attr-defined]
        assert np.array_equal(dense.predict(rows), reference) and np.array_equal(in_parts(dense.predict, rows), reference)
        times = [
            _time(lambda r: booster.inplace_predict(r), rows, budget_s),  # type: ignore[attr-defined]
            _time(lambda r: parallel.inplace_predict(r), rows, budget_s),
            _time(dense.predict, rows, budget_s),
            _time(lambda r: in_parts(dense.predict, r), rows, budget_s),
        ]
        lines.append(f"| {size} | " + " | ".join(f"{t * 1e6:,.0f}" for t in times) + " |")
        print(lines[-1], file=sys.stderr)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", type=int, default=500)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per engine and batch size")
    parser.add_argument("--no-compile", action="store_true", help="skip TL2cgen (needs gcc)")
    parser.add_argument("--threads", action="store_true", help="only the XGBoost table by batch size and call path")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.threads:
        lines = thread_table(args.trees, args.depth, args.features, args.budget)
    else:
        lines = measure(args.trees, args.depth, args.features, args.budget, not args.no_compile)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# FIL engine measurement\n\n" + text)


if __name__ == "__main__":
    main()
