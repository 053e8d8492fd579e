"""A SavedModel's config completed from its serving signature, by the rules of Triton's TensorFlow backend:
names, data types and dims from the signature, `max_batch_size` when every tensor's first dimension is variable
(and the config does not say otherwise), dynamic batching when it batches and names no scheduler. Pure: it reads
a `ModelTensor` list and writes the config; loading the model is the runtime's work."""

from __future__ import annotations

import logging

from nereid.backends.tensorflow.signature import ModelTensor, shape_text
from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "batching_hint", "complete_config"]

log = logging.getLogger("nereid.tensorflow")

# Triton's default-max-batch-size: what a model that can batch gets when its config says nothing.
DEFAULT_MAX_BATCH_SIZE = 4


def _config_dims(entry: object) -> list[int]:
    """The dims the model sees for a config tensor: its reshape where it has one."""
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)  # type: ignore[attr-defined]


def batching_hint(config: ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor]) -> bool:
    """Whether the model batches over its first dimension. The signature must allow it (every tensor's first
    dimension variable); the config's tensors then decide: dims one shorter than the model's rank say it
    batches, dims as long say it does not (both at once is an error), a ragged input says it does. A config
    naming no tensor leaves it to the signature."""
    tensors = inputs + outputs
    if not tensors or not all(t.batchable for t in tensors):
        return False
    config_tensors = list(config.input) + list(config.output)
    if not config_tensors:
        return True
    by_name = {t.name: t for t in inputs}, {t.name: t for t in outputs}
    hint = False
    explicit: bool | None = None
    for index, entries in enumerate((config.input, config.output)):
        for entry in entries:
            if index == 0 and entry.allow_ragged_batch:
                return True  # a ragged input only exists in a batch; its dims say nothing of the model's rank
            model = by_name[index].get(entry.name)
            if model is None or model.shape is None:
                continue
            dims = _config_dims(entry)
            if not dims:
                if explicit is None:
                    hint = True  # a tensor named without dims: a weaker hint than one with them
                continue
            says = len(dims) == len(model.shape) - 1
            if explicit is not None and explicit != says:
                raise NereidError.invalid(
                    f"[model '{config.name}'] unable to auto-complete the configuration: its tensors contradict each "
                    f"other on whether the model batches (tensor '{entry.name}' has dims {shape_text(dims)} for a "
                    f"model shape {shape_text(model.shape)})"
                )
            explicit = hint = says
    return hint


def _fill(config: ModelConfig, entry: object, model: ModelTensor, batching: bool) -> None:
    """Fill what a config tensor leaves out (data type, dims) from the model's tensor."""
    if entry.data_type == mc.TYPE_INVALID:  # type: ignore[attr-defined]
        entry.data_type = model.data_type  # type: ignore[attr-defined]
    if entry.dims or entry.HasField("reshape"):  # type: ignore[attr-defined]
        return
    if not model.shape:
        raise NereidError.invalid(
            f"[model '{config.name}'] unable to auto-complete tensor '{model.name}': the model gives it "
            f"{'no known rank' if model.shape is None else 'rank 0'}; declare its dims in config.pbtxt"
        )
    dims = list(model.shape[1:] if batching else model.shape)
    if dims:
        entry.dims.extend(dims)  # type: ignore[attr-defined]
    else:
        # A batch of scalars: dims [1] reshaped to nothing, as Triton shows it.
        entry.dims.append(1)  # type: ignore[attr-defined]
        entry.reshape.SetInParent()  # type: ignore[attr-defined]


def complete_config(
    config: ModelConfig,
    inputs: list[ModelTensor],
    outputs: list[ModelTensor],
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
) -> None:
    """Complete `config` from the signature's tensors, in place."""
    signature_batches = bool(inputs + outputs) and all(t.batchable for t in inputs + outputs)
    if config.max_batch_size > 0 and not signature_batches:
        raise NereidError.invalid(
            f"[model '{config.name}'] unable to auto-complete the configuration: it sets max_batch_size "
            f"{config.max_batch_size} but the model's signature has a tensor whose first dimension is not variable "
            f"({', '.join(f'{t.name} {shape_text(t.shape)}' for t in inputs + outputs if not t.batchable)})"
        )
    if config.max_batch_size == 0:
        batching = default_max_batch_size > 0 and batching_hint(config, inputs, outputs)
        if batching:
            config.max_batch_size = default_max_batch_size
            log.info(
                "model '%s': max_batch_size auto-completed to %d (the signature batches and the config sets none)",
                config.name, default_max_batch_size,
            )
    batching = config.max_batch_size > 0
    if config.max_batch_size > 1 and not config.HasField("dynamic_batching") and not config.HasField(
        "sequence_batching"
    ):
        config.dynamic_batching.SetInParent()
    # Inputs the batcher or the sequence batcher provides are not the client's: never add them as config inputs.
    provided = {name for b in config.batch_input for name in b.target_name}
    provided |= {c.name for c in config.sequence_batching.control_input}
    provided |= {s.input_name for s in config.sequence_batching.state}
    model_inputs = {t.name: t for t in inputs}
    for entry in config.input:
        model = model_inputs.pop(entry.name, None)
        if model is not None:
            _fill(config, entry, model, batching)
    for model in model_inputs.values():
        if model.name not in provided:
            entry = config.input.add()
            entry.name = model.name
            _fill(config, entry, model, batching)
    # Outputs: all of them when the config lists none; otherwise only those it lists (the rest stay unserved).
    model_outputs = {t.name: t for t in outputs}
    if not config.output:
        state_outputs = {s.output_name for s in config.sequence_batching.state}
        for model in outputs:
            if model.name not in state_outputs:
                entry = config.output.add()
                entry.name = model.name
                _fill(config, entry, model, batching)
        return
    for entry in config.output:
        model = model_outputs.get(entry.name)
        if model is not None:
            _fill(config, entry, model, batching)
