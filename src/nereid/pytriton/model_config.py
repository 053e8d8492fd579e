"""PyTriton's model configuration types (`ModelConfig`, `Tensor`, `DynamicBatcher`, `QueuePolicy`, ...), same fields
and defaults; `nereid.pytriton.triton` turns them into a config.pbtxt. No server logic here."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DeviceKind",
    "TimeoutAction",
    "QueuePolicy",
    "DynamicBatcher",
    "WarmupInput",
    "ModelWarmup",
    "ModelConfig",
    "Tensor",
]


class DeviceKind(enum.Enum):
    """Where instances run. Nereid runs bound functions on CPU threads, so only KIND_CPU and KIND_AUTO apply."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """What the queue does with a request whose timeout expired: reject it, or delay it behind the others."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """A dynamic batcher queue policy (Triton's ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """The dynamic batcher (Triton's ModelDynamicBatching): delay, preferred sizes, ordering, priorities, policies."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclasses.dataclass
class WarmupInput:
    """One input of a warmup request: zeros, random values, or a .npy file."""

    dtype: Any
    shape: Sequence[int]
    zero_data: bool | None = False
    random_data: bool | None = False
    input_data_file: str | None = None


@dataclasses.dataclass
class ModelWarmup:
    """A warmup request run `count` times through every inference callable before the model is served."""

    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int


@dataclasses.dataclass
class ModelConfig:
    """How a bound function is served: batching and its limit, the dynamic batcher, the response cache,
    decoupled (streaming) responses, warmup."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[ModelWarmup] | None = None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output: shape without the batch dimension (-1 for any size), numpy dtype (np.bytes_ or
    object for BYTES), optional name (default INPUT_<n> / OUTPUT_<n>) and, for inputs, `optional`."""

    shape: tuple[int, ...]
    dtype: Any
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)
