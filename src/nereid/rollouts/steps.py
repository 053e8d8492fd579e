"""A rollout's plan: the steps a candidate version goes through (`shadow=100%/60s,canary=10%/120s`), parsed once.
It only parses and describes; it runs nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from nereid.core.errors import NereidError

__all__ = ["Step", "StepKind", "parse_steps", "format_steps", "DEFAULT_MIN_REQUESTS"]

StepKind = Literal["shadow", "canary"]
# A step also needs this many candidate requests before its gate may pass (a quiet window proves nothing).
DEFAULT_MIN_REQUESTS = 100

_STEP = re.compile(r"^(shadow|canary)=(\d+(?:\.\d+)?)%/(\d+(?:\.\d+)?)(ms|s|m|h)?(?::(\d+))?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class Step:
    """One step: `kind` sends `percent` of the requests that name no version to the candidate, as copies (shadow:
    the client gets the primary's answer) or for real (canary), for at least `seconds` and `min_requests`."""

    kind: StepKind
    percent: float
    seconds: float
    min_requests: int = DEFAULT_MIN_REQUESTS

    def __str__(self) -> str:
        seconds = f"{self.seconds:g}s"
        extra = f":{self.min_requests}" if self.min_requests != DEFAULT_MIN_REQUESTS else ""
        return f"{self.kind}={self.percent:g}%/{seconds}{extra}"


def parse_steps(text: str) -> list[Step]:
    """`kind=percent/duration[:min_requests]`, comma-separated: kind `shadow` or `canary`, percent 0-100, duration
    in s (the default), ms, m or h. Promotion follows the last step."""
    steps = []
    for part in (piece.strip() for piece in text.split(",")):
        match = _STEP.match(part)
        if match is None:
            raise NereidError.invalid(
                f"rollout step '{part}': expected kind=percent/duration[:min_requests], kind shadow or canary, "
                f"for example shadow=100%/60s or canary=10%/120s"
            )
        kind, percent, amount, unit, minimum = match.groups()
        step = Step(
            kind,  # type: ignore[arg-type]
            float(percent),
            float(amount) * _UNIT_SECONDS[unit],
            int(minimum) if minimum is not None else DEFAULT_MIN_REQUESTS,
        )
        if not 0 < step.percent <= 100:
            raise NereidError.invalid(f"rollout step '{part}': the percentage must be above 0 and at most 100")
        steps.append(step)
    if not steps:
        raise NereidError.invalid("a rollout needs at least one step")
    return steps


def format_steps(steps: list[Step]) -> str:
    return ",".join(str(step) for step in steps)
