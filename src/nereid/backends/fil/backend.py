"""The fil backend: tree models (XGBoost, LightGBM, Treelite, scikit-learn) configured as Triton's FIL backend
configures them, with SHAP values on request. One forest per instance, each run on its own thread.

It turns config parameters into outputs (class ids, probabilities, thresholds); which engine runs the trees
is forests.py's business.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.batching import requested_names, split_outputs, stack_inputs
from nereid.backends.fil.forests import Forest, load_forest
from nereid.backends.fil.params import FilParams, model_type_from_files, read_params
from nereid.config.model_config import mc
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BACKEND", "FilBackend", "FilInstance", "INPUT", "OUTPUT", "SHAP_OUTPUT"]

log = logging.getLogger("nereid.fil")

INPUT = "input__0"
OUTPUT = "output__0"
SHAP_OUTPUT = "treeshap_output"
# Auto-complete's max_batch_size when the config has none (Triton's default-max-batch-size).
_DEFAULT_MAX_BATCH_SIZE = 4


def _params(context: ModelContext, report: bool = False) -> FilParams:
    files = {p.name for p in context.version_path.iterdir()} if context.version_path.is_dir() else set()
    return read_params(context.name, context.config.parameters, model_type_from_files(files), report)


def _model_path(context: ModelContext, params: FilParams) -> Path:
    return context.version_path / (context.config.default_model_filename or params.default_filename)


def _output_dims(params: FilParams, forest: Forest) -> list[int]:
    if params.is_classifier:
        if params.predict_proba:
            return [max(forest.n_outputs, 2)]
        return [1]
    return [forest.n_outputs]


def _shap_dims(forest: Forest) -> list[int]:
    width = forest.n_features + 1
    return [width] if forest.n_outputs == 1 else [forest.n_outputs, width]


def _where(context: ModelContext) -> str:
    return f"model '{context.name}' version {context.version}"


def _check_io(context: ModelContext, params: FilParams, forest: Forest) -> None:
    """FIL's I/O contract: input__0 FP32 [n_features], output__0 (and treeshap_output) FP32."""
    config = context.config
    where = _where(context)
    if config.max_batch_size == 0:
        raise NereidError.invalid(f"{where}: the fil backend needs a batch dimension; set max_batch_size > 0")
    inputs = {t.name: t for t in config.input}
    if list(inputs) != [INPUT]:
        raise NereidError.invalid(f"{where}: the fil backend takes one input named '{INPUT}', got {list(inputs)}")
    expected = {OUTPUT: _output_dims(params, forest), SHAP_OUTPUT: _shap_dims(forest)}
    tensors = [(INPUT, inputs[INPUT], [forest.n_features])] + [
        (o.name, o, expected.get(o.name)) for o in config.output
    ]
    for name, tensor, dims in tensors:
        if dims is None:
            raise NereidError.invalid(
                f"{where}: unexpected output '{name}'; the fil backend produces '{OUTPUT}' and '{SHAP_OUTPUT}'"
            )
        if tensor.data_type != mc.TYPE_FP32:
            raise NereidError.invalid(
                f"{where}: '{name}' has data type {mc.DataType.Name(tensor.data_type)}; the fil backend uses TYPE_FP32"
            )
        size = int(np.prod(dims))
        if list(tensor.dims) != dims and not (-1 not in tensor.dims and int(np.prod(list(tensor.dims))) == size):
            raise NereidError.invalid(
                f"{where}: '{name}' has dims {list(tensor.dims)} but the model gives {dims} "
                f"({forest.n_features} features, {forest.n_outputs} output(s), "
                f"{'classifier' if params.is_classifier else 'regressor'}"
                f"{', predict_proba' if params.predict_proba else ''})"
            )
    if OUTPUT not in {o.name for o in config.output}:
        raise NereidError.invalid(f"{where}: the fil backend needs an output named '{OUTPUT}'")


Answered = tuple[list[InferenceResponse], ExecutionTimes]
Outcome = Answered | Exception
Handed = tuple[list[InferenceRequest], asyncio.Future[Answered]]  # a batch and the future its answer goes to


def _settle(answers: list[asyncio.Future[Answered]], outcomes: list[Outcome]) -> None:
    for answer, outcome in zip(answers, outcomes):
        if answer.done():  # its caller was cancelled
            continue
        if isinstance(outcome, Exception):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)


class FilInstance:
    # Batches handed over while the forest runs one wait for its thread, which then runs all of them in one engine
    # call: the thread goes from one call to the next without waiting for the event loop, and one call for what
    # queued costs hardly more than one of its batches (XGBoost: 657 µs for 8 rows, 750 for 64; fil_engines.md).
    pipelined_batches = 4

    def __init__(self, context: ModelContext, spec: InstanceSpec, params: FilParams, forest: Forest) -> None:
        self.name = spec.name
        self._forest = forest
        self._params = params
        config = context.config
        self._output_names = [o.name for o in config.output]
        self._dims = {o.name: tuple(o.dims) for o in config.output}
        self._datatypes = dict.fromkeys(self._output_names, "FP32")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fil-{spec.name}")
        self._handed: collections.deque[Handed] = collections.deque()  # batches its thread has not taken yet

    async def execute(self, requests: list[InferenceRequest]) -> Answered:
        answer: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        self._handed.append((requests, answer))
        self._executor.submit(self._run_handed)  # finds nothing to do when an earlier call took this batch too
        return await answer

    def _run_handed(self) -> None:
        """Run every batch handed over so far in one engine call, and answer each with its own rows."""
        handed = self._handed
        batches = [handed.popleft() for _ in range(len(handed))]  # the loop's thread only appends meanwhile
        if not batches:
            return
        outcome = self._outcome([r for requests, _ in batches for r in requests])
        outcomes: list[Outcome]
        if isinstance(outcome, Exception):
            # One batch's bad data must not fail the batches it was merged with: each runs again on its own.
            outcomes = [outcome] if len(batches) == 1 else [self._outcome(requests) for requests, _ in batches]
        else:
            responses, times = outcome
            outcomes, start = [], 0
            for requests, _ in batches:
                outcomes.append((responses[start : start + len(requests)], times))
                start += len(requests)
        batches[0][1].get_loop().call_soon_threadsafe(_settle, [answer for _, answer in batches], outcomes)

    def _outcome(self, requests: list[InferenceRequest]) -> Outcome:
        try:
            return self._run(requests)
        except Exception as exc:
            return exc

    def _classes(self, raw: np.ndarray) -> np.ndarray:
        params = self._params
        if params.predict_proba:
            if raw.shape[1] == 1:
                return np.concatenate([1.0 - raw, raw], axis=1).astype(np.float32)
            return raw.astype(np.float32, copy=False)
        if raw.shape[1] == 1:
            return (raw > params.threshold).astype(np.float32)
        if raw.shape[1] == 2:
            return (raw[:, 1:2] > params.threshold).astype(np.float32)
        return np.argmax(raw, axis=1).astype(np.float32).reshape(-1, 1)

    def _run(self, requests: list[InferenceRequest]) -> Answered:
        t0 = time.monotonic_ns()
        rows = stack_inputs(requests, [INPUT], True)[INPUT]
        if rows.dtype != np.float32:
            rows = rows.astype(np.float32)
        names = requested_names(requests, self._output_names)
        t1 = time.monotonic_ns()
        arrays: list[np.ndarray] = []
        try:
            for name in names:
                if name == OUTPUT:
                    raw = self._forest.predict(rows)
                    out = self._classes(raw) if self._params.is_classifier else raw.astype(np.float32, copy=False)
                else:
                    out = self._forest.shap(rows).astype(np.float32)
                arrays.append(out.reshape((len(rows), *self._dims[name])))
        except NereidError:
            raise
        except Exception as exc:  # the frameworks raise their own types for bad data
            raise NereidError.internal(f"{self._forest.engine} failed to run the model: {exc}") from None
        t2 = time.monotonic_ns()
        responses = split_outputs(requests, names, arrays, self._datatypes, True)
        return responses, ExecutionTimes(t1 - t0, t2 - t1, time.monotonic_ns() - t2)

    async def close(self) -> None:
        self._executor.shutdown(wait=True)


class FilBackend:
    name = "fil"

    def auto_complete(self, context: ModelContext) -> None:
        """Fill input__0 [n_features], output__0 and treeshap_output dims from the model file; record the
        model_type guessed from the file name; choose max_batch_size and dynamic batching if unset."""
        config = context.config
        params = _params(context)
        path = _model_path(context, params)
        if not path.is_file():
            return  # loading reports the missing file
        if "model_type" not in config.parameters:
            config.parameters["model_type"].string_value = params.model_type
        forest = load_forest(path, params)
        if not config.input:
            config.input.add().name = INPUT
        if not config.output:
            config.output.add().name = OUTPUT
        for entry in config.input:
            if entry.name == INPUT:
                if entry.data_type == mc.TYPE_INVALID:
                    entry.data_type = mc.TYPE_FP32
                if not entry.dims:
                    entry.dims.append(forest.n_features)
        for entry in config.output:
            dims = {OUTPUT: _output_dims(params, forest), SHAP_OUTPUT: _shap_dims(forest)}.get(entry.name)
            if entry.data_type == mc.TYPE_INVALID:
                entry.data_type = mc.TYPE_FP32
            if not entry.dims and dims is not None:
                entry.dims.extend(dims)
        if config.max_batch_size == 0:
            config.max_batch_size = _DEFAULT_MAX_BATCH_SIZE
            if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
                config.dynamic_batching.SetInParent()

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> FilInstance:
        first = spec.index == 0 and spec.group_name == context.config.instance_group[0].name
        params = _params(context, report=first)
        path = _model_path(context, params)
        if not path.is_file():
            raise NereidError.unavailable(f"{_where(context)}: unable to find '{path}' for fil model_type '{params.model_type}'")
        if spec.kind == "GPU":
            log.warning("%s: instance '%s' asks for KIND_GPU; the fil backend runs tree models on the CPU", _where(context), spec.name)
        forest = await asyncio.to_thread(load_forest, path, params)
        _check_io(context, params, forest)
        log.info("%s: %s model on %s (%d features, %d output(s))", _where(context), params.model_type, forest.engine, forest.n_features, forest.n_outputs)
        return FilInstance(context, spec, params, forest)


BACKEND = FilBackend()
