"""XGBoost's in-place prediction called straight through its C API (`XGBoosterPredictFromDense`).

Why not `Booster.inplace_predict`: on the fil route's hot path its Python wrapper and a fresh proxy DMatrix per call
cost ~150 µs of a ~350 µs batch-1 call (500 trees; benchmarks/results/fil_engines.md). Here the call's JSON config
is built once, the array interface is one bytes format, and each thread reuses its own proxy DMatrix (XGBoost
builds a Context, reading cgroup files, for every new proxy). Same C function, same numbers bit for bit:
`DensePredictor.create` checks that against `inplace_predict` before it is used.
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
from typing import Any

import numpy as np

__all__ = ["DensePredictor"]

log = logging.getLogger("nereid.fil")

_U64P = ctypes.POINTER(ctypes.c_uint64)
_F32P = ctypes.POINTER(ctypes.c_float)


def _load_library() -> Any:
    from xgboost.libpath import find_lib_path

    # The library XGBoost's Python package already loaded: dlopen hands back the same copy.
    lib = ctypes.cdll.LoadLibrary(find_lib_path()[0])
    lib.XGBGetLastError.restype = ctypes.c_char_p
    return lib


class _Proxy:
    """One thread's proxy DMatrix: the C call points it at the rows of each call (calls on one thread never
    overlap, so it is never shared)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.handle = ctypes.c_void_p()
        _check(lib, lib.XGProxyDMatrixCreate(ctypes.byref(self.handle)))

    def __del__(self) -> None:
        if self.handle:
            self._lib.XGDMatrixFree(self.handle)


def _check(lib: Any, rc: int) -> None:
    if rc != 0:
        raise RuntimeError(lib.XGBGetLastError().decode(errors="replace"))


class DensePredictor:
    """`predict(rows)` = `booster.inplace_predict(rows, predict_type=...)` for C-contiguous float32 rows,
    returned flat (rows x outputs). Safe to call from several threads at once (XGBoost documents in-place
    prediction as lock free; each thread keeps its own proxy and XGBoost's result buffer is per thread)."""

    def __init__(self, lib: Any, booster: Any, margin: bool) -> None:
        self._lib = lib
        self._booster = booster  # keeps the handle alive
        self._handle = booster.handle
        self._predict = lib.XGBoosterPredictFromDense
        config = {"type": 1 if margin else 0, "training": False, "iteration_begin": 0, "iteration_end": 0,
                  "strict_shape": False, "cache_id": 0, "missing": float("nan")}
        self._config = json.dumps(config).encode()
        self._local = threading.local()

    @classmethod
    def create(cls, booster: Any, margin: bool) -> DensePredictor | None:
        """A predictor whose answers equal `inplace_predict`'s on probe rows, or None (then use that)."""
        try:
            predictor = cls(_load_library(), booster, margin)
            n = booster.num_features()
            probe = np.random.default_rng(0).standard_normal((4, n)).astype(np.float32)
            probe[1, :] = np.nan
            probe[2, ::2] = np.nan
            expected = np.asarray(booster.inplace_predict(probe, predict_type="margin" if margin else "value"))
            if np.array_equal(predictor.predict(probe), expected.reshape(-1)):
                return predictor
            log.warning("XGBoost's C API answered differently from inplace_predict; using inplace_predict")
        except (OSError, AttributeError, RuntimeError) as exc:
            log.warning("XGBoost's C API is not usable here (%s); using inplace_predict", exc)
        return None

    def predict(self, rows: np.ndarray) -> np.ndarray:
        proxy = getattr(self._local, "proxy", None)
        if proxy is None:
            proxy = self._local.proxy = _Proxy(self._lib)
        n_rows, n_features = rows.shape
        interface = b'{"data":[%d,true],"shape":[%d,%d],"typestr":"<f4","version":3}' % (
            rows.ctypes.data, n_rows, n_features)
        shape, dims, out = _U64P(), ctypes.c_uint64(), _F32P()
        # ctypes releases the GIL for the call: other requests decode and encode meanwhile.
        _check(self._lib, self._predict(self._handle, interface, self._config, proxy.handle,
                                        ctypes.byref(shape), ctypes.byref(dims), ctypes.byref(out)))
        size = 1
        for axis in range(dims.value):
            size *= shape[axis]
        if size == 0:
            return np.empty(0, np.float32)
        # Copy: the buffer is XGBoost's, reused by this thread's next call.
        return np.ctypeslib.as_array(out, (size,)).copy()
