"""An ensemble's steps as a data-flow graph, and the checks Triton makes on it: the graph alone when the
config is read, then against the composing models' configs once they are loaded. It never runs a step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError

__all__ = [
    "EnsembleStep",
    "EnsembleGraph",
    "check_ensemble_config",
    "check_composing_models",
    "ensemble_dependencies",
]


@dataclass(slots=True, frozen=True)
class EnsembleStep:
    index: int
    model_name: str
    model_version: int  # -1: the latest ready version
    # (model input name, ensemble tensor name), in the config's order.
    inputs: tuple[tuple[str, str], ...]
    # model output name -> ensemble tensor name
    outputs: dict[str, str]
    # The distinct ensemble tensors the step reads.
    input_tensors: frozenset[str]


@dataclass(slots=True)
class EnsembleGraph:
    """Who produces and who consumes each ensemble tensor."""

    name: str
    steps: list[EnsembleStep]
    inputs: list[str]
    outputs: list[str]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: ModelConfig) -> EnsembleGraph:
        steps = [
            EnsembleStep(
                index,
                step.model_name,
                int(step.model_version),
                tuple(sorted(step.input_map.items())),
                dict(sorted(step.output_map.items())),
                frozenset(step.input_map.values()),
            )
            for index, step in enumerate(config.ensemble_scheduling.step)
        ]
        graph = cls(config.name, steps, [t.name for t in config.input], [t.name for t in config.output])
        for step in steps:
            for tensor in step.outputs.values():
                graph.producer.setdefault(tensor, step.index)
            for tensor in step.input_tensors:
                graph.consumers.setdefault(tensor, []).append(step.index)
        return graph

    def needed_steps(self, outputs: frozenset[str]) -> frozenset[int]:
        """The steps that lead to `outputs`: the others need not run when a request asks for fewer outputs."""
        needed: set[int] = set()
        stack = [self.producer[t] for t in outputs if t in self.producer]
        while stack:
            index = stack.pop()
            if index in needed:
                continue
            needed.add(index)
            stack.extend(self.producer[t] for t in self.steps[index].input_tensors if t in self.producer)
        return frozenset(needed)


def ensemble_dependencies(config: ModelConfig) -> set[str]:
    return {step.model_name for step in config.ensemble_scheduling.step if step.model_name}


def _invalid(message: str) -> NereidError:
    return NereidError.invalid(message)


def check_ensemble_config(config: ModelConfig, model_name: str) -> None:
    """The checks that need only the ensemble's own config (Triton's, with its messages): the fields an
    ensemble may not have, complete steps, and a graph where every tensor is produced before it is used,
    every output is written and nothing is left unused."""
    name = config.name or model_name
    is_ensemble = config.platform == "ensemble"
    if config.HasField("ensemble_scheduling") and not is_ensemble:
        raise _invalid(f"ensemble scheduling cannot be set for model '{name}' whose platform is not ensemble")
    if not is_ensemble:
        return
    if config.backend:
        raise _invalid(f"Ensemble model '{name}' must have platform type 'ensemble' and empty backend type")
    if not config.HasField("ensemble_scheduling"):
        raise _invalid(f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble")
    if len(config.instance_group):
        raise _invalid(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise _invalid(f"optimization should not be specified for ensemble '{name}'")
    if len(config.model_warmup):
        raise _invalid(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise _invalid(f"must specify 'step' for ensemble '{name}'")
    produced_by: dict[str, int] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for what, present in (
            ("model_name", bool(step.model_name)),
            ("input_map", bool(step.input_map)),
            ("output_map", bool(step.output_map)),
        ):
            if not present:
                raise _invalid(f"must specify '{what}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in produced_by:
                raise _invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            produced_by[tensor] = index
    graph = EnsembleGraph.from_config(config)
    known = set(graph.producer) | set(graph.consumers)
    for tensor in graph.inputs:
        if tensor not in known:
            raise _invalid(f"ensemble input '{tensor}' for ensemble {name}' is not used")
    ready = _reachable(graph)
    for tensor in graph.outputs:
        if tensor not in known:
            raise _invalid(f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            source = _unready_source(graph, tensor, ready)
            if source != tensor:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise _invalid(message + _cycle_note(graph, ready))
    for tensor in sorted(known - set(graph.outputs)):
        if tensor not in ready or not graph.consumers.get(tensor):
            raise _invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'" + _cycle_note(graph, ready))


def _reachable(graph: EnsembleGraph) -> set[str]:
    """Tensors that can be computed from the ensemble inputs: a step runs once all its inputs are ready."""
    ready = set(graph.inputs)
    waiting = {step.index: len(step.input_tensors - ready) for step in graph.steps}
    queue = [step for step in graph.steps if waiting[step.index] == 0]
    while queue:
        step = queue.pop()
        for tensor in step.outputs.values():
            if tensor in ready:
                continue
            ready.add(tensor)
            for consumer in graph.consumers.get(tensor, ()):
                waiting[consumer] -= 1
                if waiting[consumer] == 0:
                    queue.append(graph.steps[consumer])
    return ready


def _unready_source(graph: EnsembleGraph, tensor: str, ready: set[str]) -> str:
    """Walk back from a tensor that is never written to the first unready tensor nothing feeds."""
    seen = {tensor}
    current = tensor
    while current in graph.producer:
        step = graph.steps[graph.producer[current]]
        upstream = next((t for _, t in step.inputs if t not in ready and t not in seen), None)
        if upstream is None:
            break
        seen.add(upstream)
        current = upstream
    return current


def _cycle_note(graph: EnsembleGraph, ready: set[str]) -> str:
    """Name a cycle among the steps that never become ready, when there is one."""
    pending = [s for s in graph.steps if not all(t in ready for t in s.input_tensors)]
    edges = {
        s.index: sorted({graph.producer[t] for t in s.input_tensors if t in graph.producer and t not in ready})
        for s in pending
    }
    state: dict[int, int] = {}
    path: list[int] = []

    def visit(node: int) -> list[int] | None:
        state[node] = 1
        path.append(node)
        for upstream in edges.get(node, ()):
            if state.get(upstream) == 1:
                return path[path.index(upstream) :] + [upstream]
            if upstream not in state:
                found = visit(upstream)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                described = " <- ".join(f"step {i} ('{graph.steps[i].model_name}')" for i in cycle)
                return f" (the steps form a cycle: {described})"
    return ""


# -- checks against the composing models ------------------------------------------------------------


@dataclass(slots=True)
class _TensorUse:
    model: str
    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def _use(model: str, batching: bool, data_type: int, dims: list[int]) -> _TensorUse:
    dims_t = tuple(int(d) for d in dims)
    return _TensorUse(model, data_type, dims_t, ((-1,) if batching else ()) + dims_t)


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _fmt(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _agree(ensemble: str, tensor: str, known: _TensorUse, new: _TensorUse) -> None:
    prefix = f"in ensemble {ensemble}, ensemble tensor {tensor}: "
    if known.data_type != new.data_type:
        raise _invalid(
            f"{prefix}inconsistent data type: {mc.DataType.Name(known.data_type)} is inferred from model "
            f"{known.model} while {mc.DataType.Name(new.data_type)} is inferred from model {new.model}"
        )
    # Either shape agrees as it stands, or once each side has its batch dimension.
    if not _dims_agree(known.dims, new.dims) and not _dims_agree(known.full_dims, new.full_dims):
        raise _invalid(
            f"{prefix}inconsistent shape: {_fmt(known.full_dims)} is inferred from model {known.model} while "
            f"{_fmt(new.full_dims)} is inferred from model {new.model}"
        )


def check_composing_models(config: ModelConfig, composing: Callable[[EnsembleStep], ModelConfig]) -> bool:
    """Check each step against its loaded model's config (batch sizes, mapped tensor names, data types,
    shapes, decoupled branches) and return whether the ensemble is decoupled: it is when any step it runs
    is. `composing(step)` gives the config of the version the step uses, or raises."""
    name = config.name
    batching = config.max_batch_size > 0
    uses: dict[str, _TensorUse] = {}
    for tensor in config.input:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        uses[tensor.name] = _use(name, batching, tensor.data_type, list(dims))
    for tensor in config.output:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        uses[tensor.name] = _use(name, batching, tensor.data_type, list(dims))
    graph = EnsembleGraph.from_config(config)
    decoupled_steps: set[int] = set()
    for step in graph.steps:
        model = composing(step)
        model_batching = model.max_batch_size > 0
        if model.max_batch_size != 0 and model.max_batch_size < config.max_batch_size:
            raise _invalid(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                f"{step.model_name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        model_inputs = {t.name: t for t in model.input}
        for model_input, tensor in step.inputs:
            if model_input not in model_inputs:
                raise _invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} "
                    f"in model {step.model_name}"
                )
        mapped = {model_input for model_input, _ in step.inputs}
        for model_input, spec in model_inputs.items():
            if model_input not in mapped and not spec.optional:
                raise _invalid(
                    f"in ensemble {name}, input {model_input} in model {step.model_name} is not mapped to any "
                    f"ensemble tensors"
                )
        for model_input, tensor in step.inputs:
            spec = model_inputs[model_input]
            _merge(uses, name, tensor, _use(step.model_name, model_batching, spec.data_type, list(spec.dims)))
        model_outputs = {t.name: t for t in model.output}
        for model_output, tensor in step.outputs.items():
            if model_output not in model_outputs:
                raise _invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                    f"{model_output} in model {step.model_name}"
                )
            spec = model_outputs[model_output]
            _merge(uses, name, tensor, _use(step.model_name, model_batching, spec.data_type, list(spec.dims)))
        if model.model_transaction_policy.decoupled:
            decoupled_steps.add(step.index)
    return _check_decoupled_branches(graph, decoupled_steps)


def _merge(uses: dict[str, _TensorUse], ensemble: str, tensor: str, new: _TensorUse) -> None:
    known = uses.get(tensor)
    if known is None:
        uses[tensor] = new
    else:
        _agree(ensemble, tensor, known, new)


def _check_decoupled_branches(graph: EnsembleGraph, decoupled_steps: set[int]) -> bool:
    """Each decoupled step starts a new stream of responses; a step (or the ensemble's response) that joins
    tensors from two different streams could never pair them up, so Triton refuses it."""
    label: dict[str, int] = dict.fromkeys(graph.inputs, 0)
    streams = 0
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for step in graph.steps:
            if step.index in done or not all(t in label for t in step.input_tensors):
                continue
            incoming = {label[t] for t in step.input_tensors}
            if len(incoming) > 1:
                raise _invalid(
                    f"in ensemble {graph.name}, step of model '{step.model_name}' receives inputs originated from "
                    f"different decoupled models"
                )
            current = next(iter(incoming)) if incoming else 0
            if step.index in decoupled_steps:
                streams += 1
                current = streams
            for tensor in step.outputs.values():
                label[tensor] = current
            done.add(step.index)
            progress = True
    if len({label[t] for t in graph.outputs if t in label}) > 1:
        raise _invalid(
            f"in ensemble {graph.name}, step of model '{graph.name}' receives inputs originated from different "
            f"decoupled models"
        )
    return streams > 0
