"""ModelConfig.model_warmup as PyTriton runs it: each warmup request is passed straight to every inference callable
before the model is loaded; a failing warmup is logged and does not stop the load."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nereid.pytriton._calls import iterate_results
from nereid.pytriton.exceptions import PyTritonBadParameterError
from nereid.pytriton.model_config import ModelWarmup, WarmupInput
from nereid.pytriton.proxy.types import Request

__all__ = ["warmup_data", "warm_up"]

log = logging.getLogger("nereid.pytriton")

_TEXT = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))


def warmup_data(item: WarmupInput, batch_size: int) -> np.ndarray:
    if not (item.zero_data or item.random_data or item.input_data_file):
        raise PyTritonBadParameterError(
            "One of 'zero_data', 'random_data', or 'input_data_file' must be provided for warmup input."
        )
    shape = (batch_size, *tuple(item.shape))
    dtype = item.dtype
    if item.input_data_file:
        data = np.load(item.input_data_file)
        if data.shape == shape:
            return data.astype(dtype)
        if data.ndim == len(item.shape):
            return np.repeat(data[np.newaxis, ...], batch_size, axis=0).astype(dtype)
        if data.shape[1:] == tuple(item.shape):
            reps = -(-batch_size // data.shape[0])
            return np.tile(data, (reps,) + (1,) * (data.ndim - 1))[:batch_size].astype(dtype)
        raise PyTritonBadParameterError(f"Input data file shape {data.shape} doesn't match expected shape {shape}")
    if item.zero_data:
        return np.zeros(shape, dtype=dtype)
    rng = np.random.default_rng()
    if dtype in (np.bytes_, object, np.object_, bytes):
        count = int(np.prod(shape))
        words = [b"".join(c.encode() for c in rng.choice(_TEXT, rng.integers(8, 33))) for _ in range(count)]
        return np.array(words, dtype=dtype).reshape(shape)
    if dtype in (np.bool_, bool):
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127), size=shape, endpoint=True).astype(dtype)
    return rng.random(shape).astype(dtype)


def warm_up(model_name: str, callables: Sequence[Callable[..., Any]], warmups: Sequence[ModelWarmup]) -> None:
    try:
        requests = [
            {name: warmup_data(item, warmup.batch_size) for name, item in warmup.inputs.items()}
            for warmup in warmups
            for _ in range(warmup.count)
        ]
    except Exception as exc:
        log.error("Failed to perform warmup for model %s: %s; loading it anyway", model_name, exc)
        return
    runner = _NoThread()
    try:
        for index, function in enumerate(callables):
            for data in requests:
                try:
                    for _ in iterate_results(function([Request(data=dict(data))]), runner):
                        pass
                except Exception as exc:
                    log.warning("Warmup request failed for inference function %d of model %s: %s", index, model_name, exc)
    finally:
        runner.close()


class _NoThread:
    """Async callables warmed up on a loop of their own, in the calling thread."""

    def __init__(self) -> None:
        import asyncio

        self._loop = asyncio.new_event_loop()

    def async_loop(self) -> Any:
        return self._loop

    def close(self) -> None:
        self._loop.close()
