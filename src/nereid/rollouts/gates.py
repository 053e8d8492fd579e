"""The evidence gate at the end of a rollout step: the candidate's window against its objectives and against the
primary over the same window. Objectives are declared in config.pbtxt `parameters`; without them the defaults
below apply. Pure: it judges figures, it changes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nereid.core.errors import NereidError
from nereid.rollouts.window import WindowFigures

__all__ = ["Objectives", "Verdict", "judge", "OBJECTIVE_KEYS"]

# config.pbtxt parameters { key: "rollout_max_p99_ms" value { string_value: "25" } } and so on (docs/rollouts.md).
OBJECTIVE_KEYS = {
    "rollout_max_p99_ms": "max_p99_ms",
    "rollout_max_error_rate": "max_error_rate",
    "rollout_max_divergence": "max_divergence",
    "rollout_max_input_drift": "max_input_drift",
    "rollout_max_cpu_ms_per_request": "max_cpu_ms_per_request",
}
# The default gates when a model declares no objective of that kind.
DEFAULT_ERROR_RATE_MARGIN = 0.01  # the primary's error rate plus one percentage point
DEFAULT_P99_FACTOR = 1.5  # 1.5x the primary's p99 ...
DEFAULT_P99_MARGIN_MS = 5.0  # ... plus 5 ms


@dataclass(frozen=True, slots=True)
class Objectives:
    max_p99_ms: float | None = None
    max_error_rate: float | None = None
    max_divergence: float | None = None
    max_input_drift: float | None = None
    max_cpu_ms_per_request: float | None = None

    @classmethod
    def from_parameters(cls, parameters: Any, model: str) -> Objectives:
        """From a ModelConfig's `parameters` map (string values); a malformed value is an INVALID_ARG naming it."""
        values: dict[str, float] = {}
        for key, name in OBJECTIVE_KEYS.items():
            if key in parameters:
                text = parameters[key].string_value
                try:
                    values[name] = float(text)
                except ValueError:
                    raise NereidError.invalid(
                        f"[model '{model}'] parameter '{key}': expected a number, got '{text}'"
                    ) from None
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def judge(
    candidate: WindowFigures, primary: WindowFigures, objectives: Objectives, input_drift: float | None = None
) -> Verdict:
    """Whether the candidate passes: every declared objective, and the default gates where none is declared."""
    reasons = []
    if objectives.max_error_rate is not None:
        if candidate.error_rate > objectives.max_error_rate:
            reasons.append(f"error rate {candidate.error_rate:.2%} above the objective {objectives.max_error_rate:.2%}")
    elif candidate.error_rate > primary.error_rate + DEFAULT_ERROR_RATE_MARGIN:
        reasons.append(
            f"error rate {candidate.error_rate:.2%} above the primary's {primary.error_rate:.2%} plus 1 point"
        )
    if objectives.max_p99_ms is not None:
        if candidate.p99_ms > objectives.max_p99_ms:
            reasons.append(f"p99 {candidate.p99_ms:.1f} ms above the objective {objectives.max_p99_ms:g} ms")
    elif primary.requests and candidate.p99_ms > DEFAULT_P99_FACTOR * primary.p99_ms + DEFAULT_P99_MARGIN_MS:
        reasons.append(
            f"p99 {candidate.p99_ms:.1f} ms above 1.5x the primary's {primary.p99_ms:.1f} ms plus 5 ms"
        )
    if objectives.max_divergence is not None and candidate.compared and candidate.divergence > objectives.max_divergence:
        reasons.append(f"output divergence {candidate.divergence:.4f} above the objective {objectives.max_divergence:g}")
    if objectives.max_input_drift is not None and input_drift is not None and input_drift > objectives.max_input_drift:
        reasons.append(f"input drift {input_drift:.3f} above the objective {objectives.max_input_drift:g}")
    if objectives.max_cpu_ms_per_request is not None and candidate.cpu_ms_per_request > objectives.max_cpu_ms_per_request:
        reasons.append(
            f"CPU {candidate.cpu_ms_per_request:.2f} ms per request above the objective "
            f"{objectives.max_cpu_ms_per_request:g} ms"
        )
    return Verdict(not reasons, reasons)
