"""Helpers backends share to run one batch: stack the requests' inputs, split outputs back as views."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

__all__ = ["stack_inputs", "split_outputs", "requested_names"]


def stack_inputs(requests: list[InferenceRequest], names: list[str], batching: bool) -> dict[str, np.ndarray]:
    """One array per input name: the request's own array, or all of them concatenated on axis 0."""
    if len(requests) == 1 or not batching:
        first = requests[0]
        return {t.name: t.data for t in first.inputs}
    return {name: np.concatenate([r.input(name).data for r in requests], axis=0) for name in names}  # type: ignore[union-attr]


def requested_names(requests: list[InferenceRequest], all_outputs: list[str]) -> list[str]:
    """The union of outputs the batch asked for, in the model's order."""
    wanted: set[str] = set()
    for request in requests:
        if request.outputs is None:
            return all_outputs
        wanted.update(o.name for o in request.outputs)
    return [name for name in all_outputs if name in wanted]


def split_outputs(
    requests: list[InferenceRequest],
    names: list[str],
    arrays: list[np.ndarray],
    datatypes: dict[str, str],
    batching: bool,
    always: Collection[str] = (),
) -> list[InferenceResponse]:
    """Give each request its rows of each output it asked for, as views of the batch output; outputs named
    in `always` (implicit state outputs the sequence batcher takes back) go to every request."""
    responses: list[InferenceResponse] = []
    offset = 0
    for request in requests:
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        size = request.batch_size
        outputs: list[OutputTensor] = []
        for name, array in zip(names, arrays, strict=False):
            if wanted is not None and name not in wanted and name not in always:
                continue
            part = array[offset : offset + size] if batching and len(requests) > 1 else array
            outputs.append(OutputTensor(name, datatypes[name], part.shape, part))
        responses.append(
            InferenceResponse(request.model_name, request.model_version, request.id, outputs)
        )
        offset += size
    return responses
