"""The configurations analyze may try: `Variant` (one point: max_batch_size, dynamic batching with its queue
delay and preferred sizes, instance count, ONNX intra-op threads), `SearchSpace` (the grid of those values
for one model) and `apply_variant`, which writes a variant into a copy of the model's config."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from nereid.tools.analyze.model_config import ModelConfig, empty_config, is_onnx
from nereid.tools.analyze.settings import AnalyzeSettings

__all__ = ["Dimension", "Point", "SearchSpace", "Variant", "apply_variant", "variant_of_config"]

_THREADS_PARAMETER = "intra_op_thread_count"

Point = tuple[int, ...]  # one index per dimension of a SearchSpace


@dataclass(frozen=True, slots=True)
class Variant:
    """One configuration to measure. Without dynamic batching the server never forms batches, so such variants
    keep the model's own max_batch_size and have no queue delay or preferred sizes."""

    max_batch_size: int
    dynamic_batching: bool
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    instance_count: int
    intra_op_threads: int | None  # None: leave the parameter as the model has it

    @property
    def name(self) -> str:
        parts = [f"mbs{self.max_batch_size}"]
        if self.dynamic_batching:
            parts.append(f"db_q{self.max_queue_delay_us}us")
            if self.preferred_batch_sizes:
                parts.append("pref" + "-".join(str(s) for s in self.preferred_batch_sizes))
        else:
            parts.append("nodb")
        parts.append(f"i{self.instance_count}")
        if self.intra_op_threads is not None:
            parts.append(f"t{self.intra_op_threads}")
        return "_".join(parts)

    def describe(self) -> str:
        batching = (
            f"dynamic batching (delay {self.max_queue_delay_us} us"
            + (f", preferred {list(self.preferred_batch_sizes)}" if self.preferred_batch_sizes else "")
            + ")"
            if self.dynamic_batching
            else "no dynamic batching"
        )
        text = f"max_batch_size {self.max_batch_size}, {batching}, {self.instance_count} instance(s)"
        if self.intra_op_threads is not None:
            text += f", {self.intra_op_threads} intra-op thread(s)"
        return text


def variant_of_config(config: ModelConfig) -> Variant:
    """The point a config already is (what the model's own config measures as the baseline)."""
    batching = config.HasField("dynamic_batching")
    count = config.instance_group[0].count if config.instance_group else 1
    threads_text = config.parameters[_THREADS_PARAMETER].string_value if _THREADS_PARAMETER in config.parameters else ""
    threads = int(threads_text) if threads_text.strip().isdigit() else None
    return Variant(
        max_batch_size=int(config.max_batch_size),
        dynamic_batching=batching,
        max_queue_delay_us=int(config.dynamic_batching.max_queue_delay_microseconds) if batching else 0,
        preferred_batch_sizes=tuple(int(s) for s in config.dynamic_batching.preferred_batch_size) if batching else (),
        instance_count=max(1, int(count)),
        intra_op_threads=threads,
    )


def apply_variant(base: ModelConfig, variant: Variant) -> ModelConfig:
    """A copy of `base` with the variant's settings; everything else (inputs, outputs, parameters, other
    dynamic-batching fields such as priorities) stays as the model has it."""
    config = empty_config()
    config.CopyFrom(base)
    config.max_batch_size = variant.max_batch_size
    if variant.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = variant.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(variant.preferred_batch_sizes)
    else:
        config.ClearField("dynamic_batching")
    group = empty_config().instance_group.add()
    if base.instance_group:
        group.CopyFrom(base.instance_group[0])
    group.count = variant.instance_count
    del config.instance_group[:]
    config.instance_group.append(group)
    if variant.intra_op_threads is not None:
        config.parameters[_THREADS_PARAMETER].string_value = str(variant.intra_op_threads)
    return config


@dataclass(frozen=True, slots=True)
class Dimension:
    name: str
    values: tuple[object, ...]


def _powers_of_two(low: int, high: int) -> list[int]:
    values, v = [], 1
    while v <= high:
        if v >= low:
            values.append(v)
        v *= 2
    return values


class SearchSpace:
    """The grid for one model: the values of each knob, from the flags or from defaults that fit the model and
    this machine. Points are index tuples so a hill climber can step along one knob at a time."""

    def __init__(self, settings: AnalyzeSettings, base: ModelConfig, notes: list[str]) -> None:
        self.base_max_batch_size = int(base.max_batch_size)
        batching_allowed = self.base_max_batch_size > 0 and not base.HasField("sequence_batching")
        cores = os.cpu_count() or 1
        if not batching_allowed:
            if settings.dynamic_batching and True in settings.dynamic_batching:
                reason = "has sequence batching" if base.HasField("sequence_batching") else "has max_batch_size 0"
                notes.append(f"dynamic batching is not tried: the model {reason}")
            batching = [False]
        else:
            batching = settings.dynamic_batching or [False, True]
        if self.base_max_batch_size > 0:
            sizes = settings.max_batch_sizes or _powers_of_two(2, 64)
        else:
            if settings.max_batch_sizes:
                notes.append("--max-batch-sizes is ignored: the model has max_batch_size 0 (its inputs have no batch dimension)")
            sizes = [0]
        sizes = [s for s in sizes if s == 0 or s >= settings.batch_size]
        if not sizes:
            sizes = [max(self.base_max_batch_size, settings.batch_size)]
            notes.append(f"every --max-batch-sizes value is below --batch-size {settings.batch_size}: using {sizes[0]}")
        delays = settings.max_queue_delays_us or [0, 500]
        preferred = settings.preferred_batch_sizes or ["none"]
        instances = settings.instance_counts or list(range(1, min(4, cores) + 1))
        threads: list[int | None]
        if is_onnx(base):
            threads = list(settings.intra_op_threads or _powers_of_two(1, cores))
        else:
            if settings.intra_op_threads:
                notes.append("--intra-op-threads is ignored: it is an onnxruntime parameter and this model is not ONNX")
            threads = [None]
        self.dimensions = (
            Dimension("dynamic_batching", tuple(batching)),
            Dimension("max_batch_size", tuple(sizes)),
            Dimension("max_queue_delay_us", tuple(delays)),
            Dimension("preferred_batch_sizes", tuple(preferred)),
            Dimension("instance_count", tuple(instances)),
            Dimension("intra_op_threads", tuple(threads)),
        )

    def variant_at(self, point: Point) -> Variant | None:
        """The variant a point stands for; None when the point makes no sense (a preferred size above the
        max_batch_size)."""
        batching, size, delay, preferred, count, threads = (d.values[i] for d, i in zip(self.dimensions, point))
        assert isinstance(size, int) and isinstance(delay, int) and isinstance(count, int) and isinstance(preferred, str)
        if not batching:
            return Variant(self.base_max_batch_size, False, 0, (), count, threads)  # type: ignore[arg-type]
        if preferred == "none":
            sizes: tuple[int, ...] = ()
        elif preferred == "max":
            sizes = (size,)
        else:
            if int(preferred) > size:
                return None
            sizes = (int(preferred),)
        return Variant(size, True, delay, sizes, count, threads)  # type: ignore[arg-type]

    def points(self) -> list[Point]:
        return list(itertools.product(*(range(len(d.values)) for d in self.dimensions)))

    def all_variants(self) -> list[Variant]:
        """Every distinct variant, in grid order (without dynamic batching first)."""
        seen: dict[Variant, None] = {}
        for point in self.points():
            variant = self.variant_at(point)
            if variant is not None:
                seen.setdefault(variant, None)
        return list(seen)

    def nearest_point(self, variant: Variant) -> Point:
        """The grid point closest to a variant (where a hill climb starting from the model's config begins)."""
        wanted: tuple[object, ...] = (
            variant.dynamic_batching,
            variant.max_batch_size,
            variant.max_queue_delay_us,
            "max" if variant.preferred_batch_sizes == (variant.max_batch_size,) else "none",
            variant.instance_count,
            variant.intra_op_threads,
        )
        point = []
        for dimension, value in zip(self.dimensions, wanted):
            point.append(_closest_index(dimension.values, value))
        return tuple(point)

    def neighbours(self, point: Point) -> list[Point]:
        """Points one step away along one knob."""
        result = []
        for axis, dimension in enumerate(self.dimensions):
            for step in (-1, 1):
                index = point[axis] + step
                if 0 <= index < len(dimension.values):
                    result.append(point[:axis] + (index,) + point[axis + 1 :])
        return result

    def describe(self) -> str:
        shown = [d for d in self.dimensions if d.values != (None,)]
        return "; ".join(f"{d.name} {list(d.values)}" for d in shown)


def _closest_index(values: tuple[object, ...], value: object) -> int:
    if value in values:
        return values.index(value)
    if isinstance(value, int) and not isinstance(value, bool) and all(isinstance(v, int) for v in values):
        return min(range(len(values)), key=lambda i: abs(int(values[i]) - value))  # type: ignore[call-overload]
    return 0
