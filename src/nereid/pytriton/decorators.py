"""PyTriton's inference-callable decorators (`batch`, `sample`, `group_by_keys`, `group_by_values`, `fill_optionals`,
`first_value`, `pad_batch`, `triton_context`) and the triton context they read, with PyTriton's semantics and errors.

They only reshape what the callable receives and returns; they never reach the server.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np

from nereid.core.dtypes import serialize_bytes
from nereid.pytriton._model_spec import TritonModelConfig
from nereid.pytriton._wrapping import decorator, wrapper_stack
from nereid.pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError

__all__ = [
    "TRITON_CONTEXT_FIELD_NAME",
    "ConstantPadder",
    "ModelConfigDict",
    "TritonContext",
    "batch",
    "convert_output",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "get_triton_context",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = ("__triton_context__",)

InferenceRequest = dict[str, np.ndarray]
InferenceResult = dict[str, np.ndarray]


def get_inference_request_batch_size(inference_request: Any) -> int:
    """The batch size of a request: the first dimension of its first input."""
    first = next(iter(inference_request.values()))
    return int(first.shape[0])


class ModelConfigDict(MutableMapping[Callable[..., Any], TritonModelConfig]):
    """Model configs by inference callable; a callable object's `__call__` and the object share one entry."""

    def __init__(self) -> None:
        self._data: dict[str, TritonModelConfig] = {}
        self._keys: list[Callable[..., Any]] = []

    @staticmethod
    def _key(infer_callable: Callable[..., Any]) -> str:
        key: Any = infer_callable
        if inspect.ismethod(key) and key.__name__ == "__call__":
            key = key.__self__
        return str(key)

    def __getitem__(self, infer_callable: Callable[..., Any]) -> TritonModelConfig:
        return self._data[self._key(infer_callable)]

    def __setitem__(self, infer_callable: Callable[..., Any], item: TritonModelConfig) -> None:
        self._keys.append(infer_callable)
        self._data[self._key(infer_callable)] = item

    def __delitem__(self, infer_callable: Callable[..., Any]) -> None:
        del self._data[self._key(infer_callable)]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        return iter(self._keys)


@dataclasses.dataclass
class TritonContext:
    """What `@triton_context` passes as `triton_context`: the model config of each bound callable."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def get_triton_context(wrapped: Any, instance: Any) -> TritonContext:
    caller = instance or wrapped
    if not hasattr(caller, "__triton_context__"):
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    context: TritonContext = caller.__triton_context__
    return context


def get_model_config(wrapped: Any, instance: Any) -> TritonModelConfig:
    """The TritonModelConfig of the model a callable is bound to (for custom decorators, as in PyTriton)."""
    return get_triton_context(wrapped, instance).model_configs[wrapped]


def convert_output(
    outputs: Any, wrapped: Any = None, instance: Any = None, model_config: TritonModelConfig | None = None
) -> dict[str, Any]:
    """A list or tuple of outputs in the model's output order becomes a dict by output name."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        if model_config is None:
            model_config = get_model_config(wrapped, instance)
        config_outputs = list(model_config.outputs or ())
        if len(outputs) != len(config_outputs):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: output for spec, output in zip(config_outputs, outputs, strict=True)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


@decorator
def sample(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """For models without batching: the first request's inputs become keyword arguments; the result, one response."""
    kwargs.update(args[0][0])
    outputs = wrapped(*args[1:], **kwargs)
    return [convert_output(outputs, wrapped, instance)]


@decorator
def batch(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The requests' inputs concatenated into one batch per input (keyword arguments); the outputs split back into
    one response per request by the requests' batch sizes. Generators are split one yield at a time."""
    requests = args[0]
    input_names = requests[0].keys()
    for other in requests[1:]:
        if input_names != other.keys():
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    inputs = {
        name: requests[0][name] if len(requests) == 1 else np.concatenate([r[name] for r in requests])
        for name in input_names
    }
    new_kwargs = dict(kwargs)
    new_kwargs.update(inputs)
    outputs = wrapped(*args[1:], **new_kwargs)
    sizes = [get_inference_request_batch_size(r) for r in requests]

    def split(result: Any) -> list[dict[str, Any]]:
        converted = convert_output(result, wrapped, instance)
        total = sum(sizes)
        wrong = {name: tensor.shape for name, tensor in converted.items() if tensor.shape[0] != total}
        if wrong:
            listed = ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
            raise ValueError(f"Received output tensors with different batch sizes: {listed}. Expected batch size: {total}. ")
        if len(sizes) == 1:
            return [converted]
        responses = []
        start = 0
        for size in sizes:
            responses.append({name: tensor[start : start + size, ...] for name, tensor in converted.items()})
            start += size
        return responses

    if inspect.isgenerator(outputs):
        return (split(result) for result in outputs)
    return split(outputs)


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == np.object_ or value.dtype.type == np.bytes_:
            return serialize_bytes(value)
        return value.tobytes()
    return value


def group_by_values(*keys: str, pad_fn: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """Split a batch (after @batch) into sub-batches whose samples share the values of `keys`, call the function per
    sub-batch, and put the results back in the original order (optionally padded by `pad_fn` first)."""

    def group(request: dict[str, np.ndarray], batch_size: int) -> Iterator[tuple[tuple[int, ...], dict[str, Any]]]:
        indexed = [(i, tuple(_value_key(request[key][i]) for key in keys)) for i in range(batch_size)]
        indexed.sort(key=operator.itemgetter(1))
        for _, members in itertools.groupby(indexed, key=operator.itemgetter(1)):
            indices, _keys = zip(*members, strict=True)
            yield indices, {name: value[indices, ...] for name, value in request.items()}

    @decorator
    def _wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if batch.__wrapper__ in wrapper_stack(wrapped):  # type: ignore[attr-defined]
            raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")
        request = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
        others = {k: v for k, v in kwargs.items() if k in _SPECIAL_KEYS}
        batch_size = get_inference_request_batch_size(request)
        results: list[tuple[tuple[int, ...], Any]] = []
        for indices, sub_request in group(request, batch_size):
            results.append((indices, wrapped(*args, **sub_request, **others)))
        if pad_fn is not None:
            index_lists, partials = zip(*results, strict=True)
            results = list(zip(index_lists, pad_fn(partials), strict=True))
        first = results[0][1]
        merged = {name: np.zeros((batch_size,) + data.shape[1:], dtype=data.dtype) for name, data in first.items()}
        for indices, partial in results:
            for name, data in partial.items():
                merged[name][list(indices), ...] = data
        return merged

    return _wrapper


class ConstantPadder:
    """A `pad_fn` for group_by_values: pads every sub-batch's arrays to the largest shape with `pad_value`."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches_list: Any) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(name for item in batches_list for name in item.keys()))
        by_name = {name: [item.get(name) for item in batches_list] for name in names}
        for arrays in by_name.values():
            present = [a for a in arrays if a is not None]
            shape = tuple(np.max([a.shape[1:] for a in present], axis=0))
            dtypes = [a.dtype for a in present]
            dtype = dtypes[0]
            if not all(d.kind == dtype.kind for d in dtypes):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            if dtype.kind in "SU":
                dtype = np.dtype(f"{dtype.str[:2]}{max(int(d.str[2:]) for d in dtypes)}")
            elif not all(d == dtype for d in dtypes):
                raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
            fill = self.pad_value if dtype.kind not in "SUO" else b""
            for index, array in enumerate(arrays):
                if array is not None:
                    widths = [(0, 0)] + [(0, b - a) for a, b in zip(array.shape[1:], shape, strict=True)]
                    arrays[index] = np.pad(array, widths, mode="constant", constant_values=fill).astype(dtype)
        return [
            {name: arrays[i] for name, arrays in by_name.items() if arrays[i] is not None}
            for i in range(len(batches_list))
        ]


@decorator
def group_by_keys(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call the function once per group of requests that have the same set of inputs; responses keep request order."""
    requests = args[0]
    indexed = sorted(
        ((i, tuple(sorted(r.keys())), r) for i, r in enumerate(requests)), key=operator.itemgetter(1)
    )
    answered: list[tuple[int, Any]] = []
    for _, members in itertools.groupby(indexed, key=operator.itemgetter(1)):
        indices, _names, group = zip(*members, strict=True)
        outputs = wrapped(list(group), *args[1:], **kwargs)
        answered.extend(zip(indices, outputs, strict=False))
    answered.sort(key=operator.itemgetter(0))
    return [response for _, response in answered]


def _shape_matches(have: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return len(have) == len(expected) and all(e == -1 or h == e for h, e in zip(have, expected, strict=True))


def fill_optionals(**defaults: Any) -> Callable[[Any], Any]:
    """Inputs missing from a request get these defaults (numpy arrays without the batch axis, repeated per sample)."""

    def verify(model_config: TritonModelConfig) -> None:
        inputs = {spec.name: spec for spec in model_config.inputs or ()}
        unknown = sorted(set(defaults) - set(inputs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
        not_numpy = {k: v for k, v in defaults.items() if not isinstance(v, np.ndarray)}
        if not_numpy:
            listed = ", ".join(f"{k}={v}" for k, v in not_numpy.items())
            raise PyTritonBadParameterError(f"Could not use {listed} defaults as they are not NumPy arrays")
        wrong_dtypes = {k: (v.dtype, inputs[k].dtype) for k, v in defaults.items() if v.dtype != inputs[k].dtype}
        if wrong_dtypes:
            listed = ", ".join(f"{k}: dtype={have} expected_dtype={want}" for k, (have, want) in wrong_dtypes.items())
            raise PyTritonBadParameterError(
                f"Could not use {listed} defaults as they have different than input signature dtypes"
            )
        wrong_shapes = {
            k: (v.shape, inputs[k].shape) for k, v in defaults.items() if not _shape_matches(v.shape, inputs[k].shape)
        }
        if wrong_shapes:
            listed = ", ".join(f"{k}: shape={have} expected_shape={want}" for k, (have, want) in wrong_shapes.items())
            raise PyTritonBadParameterError(
                f"Could not use {listed} defaults as they have different than input signature shapes"
            )

    @decorator
    def _wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        model_config = get_model_config(wrapped, instance)
        verify(model_config)
        (requests,) = args
        batching = model_config.batching
        for request in requests:
            batch_size = get_inference_request_batch_size(request) if batching and len(request) else 1
            for name, value in defaults.items():
                if name in request:
                    continue
                request[name] = np.tile(value, (batch_size,) + (1,) * value.ndim) if batching else value
        return wrapped(*args, **kwargs)

    return _wrapper


@decorator
def triton_context(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Pass the triton context (model configs by callable) as the keyword argument `triton_context`."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **kwargs)


@decorator
def pad_batch(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Repeat each input's last row until the batch reaches the nearest preferred batch size (or max_batch_size)."""
    inputs = {k: v for k, v in kwargs.items() if k != "__triton_context__"}
    first = next(iter(inputs.values()))
    config = get_model_config(wrapped, instance)
    sizes = sorted(config.batcher.preferred_batch_size) if config.batcher and config.batcher.preferred_batch_size else []
    sizes.append(config.max_batch_size)
    target = sizes[bisect_left(sizes, first.shape[0])]
    for name, array in inputs.items():
        repeats = np.ones(array.shape[0], dtype=np.int64)
        repeats[-1] = target - array.shape[0] + 1
        kwargs[name] = np.repeat(array, repeats, axis=0)
    return wrapped(*args, **kwargs)


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Callable[[Any], Any]:
    """Replace the named inputs with their first sample (squeezed to a scalar when it holds one value); with
    `strict`, every sample must carry the same value. Only for models with batching."""
    special = [key for key in keys if key in _SPECIAL_KEYS]
    if special:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(special)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL_KEYS)}"
        )

    @decorator
    def _wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        model_config = get_model_config(wrapped, instance)
        if not model_config.batching:
            raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support batching.")

        def replace(request: Any) -> Any:
            for name in keys:
                if name not in request:
                    continue
                values = request[name]
                if strict:
                    unique = np.unique(values, axis=None if values.dtype == object else 0)
                    if len(unique) > 1:
                        raise PyTritonRuntimeError(
                            f"The values on the {name!r} input are not equal. "
                            "To proceed, either disable strict mode in @first_value wrapper "
                            "or ensure that the values always are consistent. "
                            f"The current values of {name!r} are {request[name]!r}."
                        )
                value = values[0]
                if squeeze_single_values and not np.isscalar(value) and all(dim == 1 for dim in value.shape):
                    value = np.squeeze(value)[()]
                request[name] = value
            return request

        if set(kwargs) - set(_SPECIAL_KEYS):
            return wrapped(*args, **replace(kwargs))
        requests, *others = args
        return wrapped([replace(r) for r in requests], *others, **kwargs)

    return _wrapper
