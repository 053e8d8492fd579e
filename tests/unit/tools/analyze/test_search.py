"""`nereid analyze` search strategies and objectives, driven by synthetic scores instead of a server."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from nereid.tools.analyze.objectives import Constraints, best_pick, variant_score
from nereid.tools.analyze.results import LevelMeasurement, VariantOutcome
from nereid.tools.analyze.search_space import SearchSpace, Variant
from nereid.tools.analyze.settings import AnalyzeSettings
from nereid.tools.analyze.strategies import BruteForceSearch, HillClimbSearch, SearchStrategy

BASE = """
name: "m" backend: "python" max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _space(**kwargs: object) -> SearchSpace:
    defaults: dict[str, object] = {"max_batch_sizes": [2, 4, 8, 16, 32], "max_queue_delays_us": [0, 100, 1000], "instance_counts": [1, 2, 3, 4]}
    defaults.update(kwargs)
    return SearchSpace(AnalyzeSettings("m", **defaults), text_format.Parse(BASE, mc.ModelConfig()), [])  # type: ignore[arg-type]


def _drive(strategy: SearchStrategy, value: Callable[[Variant], float]) -> list[Variant]:
    order = []
    while (variant := strategy.next_variant()) is not None:
        assert variant not in order, "a variant is proposed twice"
        order.append(variant)
        strategy.record(variant, (True, value(variant)))
    return order


def _smooth(v: Variant) -> float:
    # Best at dynamic batching, max_batch_size 16, delay 100, 3 instances; falls off smoothly around it.
    score = 100.0 if v.dynamic_batching else 40.0
    score -= 3 * abs(v.max_batch_size.bit_length() - 5) + 4 * abs(v.instance_count - 3) + abs(v.max_queue_delay_us - 100) / 100
    return score


def test_brute_force_proposes_every_variant_once() -> None:
    space = _space()
    order = _drive(BruteForceSearch(space), _smooth)
    assert set(order) == set(space.all_variants()) and len(order) == len(space.all_variants())


def test_hill_climbing_finds_the_optimum_of_a_smooth_space_with_fewer_measurements() -> None:
    space = _space()
    start = Variant(8, False, 0, (), 1, None)
    order = _drive(HillClimbSearch(space, start), _smooth)
    assert order[0] == start
    best = max(order, key=_smooth)
    assert best == max(space.all_variants(), key=_smooth) == Variant(16, True, 100, (), 3, None)
    assert len(order) < len(space.all_variants()) / 2


def test_hill_climbing_stops_at_a_local_optimum_and_ignores_noise_sized_gains() -> None:
    space = _space()
    start = Variant(8, False, 0, (), 1, None)
    # Every neighbour is within 1% of the start: no move.
    order = _drive(HillClimbSearch(space, start), lambda v: 100.0 if v == start else 100.5)
    assert order[0] == start and len(order) == 1 + len(space.neighbours(space.nearest_point(start))) - 3
    # (the three neighbours along max_batch_size/delay/preferred are the same variant without dynamic batching)


def test_hill_climbing_moves_out_of_infeasible_regions_by_shortfall() -> None:
    space = _space(max_batch_sizes=[8], max_queue_delays_us=[0], instance_counts=[1, 2, 3, 4])
    strategy = HillClimbSearch(space, Variant(8, False, 0, (), 1, None))
    seen = []
    while (variant := strategy.next_variant()) is not None:
        seen.append(variant)
        feasible = variant.instance_count >= 4
        strategy.record(variant, (feasible, 1.0 if feasible else -(4 - variant.instance_count)))
    assert any(v.instance_count == 4 for v in seen)


def _m(name: str, c: int, throughput: float, p99: float, memory: float | None = 100.0) -> LevelMeasurement:
    return LevelMeasurement(name, c, throughput, p99 / 2, p99, p99, p99, p99 / 2, None, None, 10.0, 50.0, memory, None, None, True)


def _outcome(name: str, *levels: LevelMeasurement, constraints: Constraints | None = None) -> VariantOutcome:
    outcome = VariantOutcome(name, Variant(8, False, 0, (), 1, None), "", 1, list(levels))
    for m in outcome.measurements:
        (constraints or Constraints()).mark(m)
    return outcome


def test_constraints_name_each_violation_and_unknown_memory_passes() -> None:
    c = Constraints(max_p99_latency_ms=5, min_throughput=100, max_memory_mb=200)
    m = _m("a", 1, 50, 8, 300)
    c.mark(m)
    assert not m.meets_constraints and len(m.violations) == 3
    assert "p99 8.00 ms > 5 ms" in m.violations[0]
    unknown = _m("a", 1, 150, 4, None)
    c.mark(unknown)
    assert unknown.meets_constraints
    assert c.shortfall(_m("a", 1, 50, 10, 100)) == 1.0 + 0.5


def test_best_pick_per_objective_respects_the_constraints() -> None:
    c = Constraints(max_p99_latency_ms=10)
    fast = _outcome("fast", _m("fast", 1, 100, 1), _m("fast", 8, 900, 9), constraints=c)
    wide = _outcome("wide", _m("wide", 1, 80, 2), _m("wide", 8, 2000, 30), constraints=c)
    throughput = best_pick("max_throughput", [fast, wide])
    assert throughput is not None and throughput.outcome is fast and throughput.measurement.concurrency == 8
    latency = best_pick("min_latency", [fast, wide])
    assert latency is not None and latency.outcome is fast and latency.measurement.p99_ms == 1
    assert variant_score("max_throughput", wide, c) == (True, 80)
    strict = Constraints(max_p99_latency_ms=0.5)
    for o in (fast, wide):
        for m in o.measurements:
            strict.mark(m)
    assert best_pick("max_throughput", [fast, wide]) is None
    assert variant_score("max_throughput", fast, strict)[0] is False
    assert variant_score("max_throughput", _outcome("failed"), strict) == (False, float("-inf"))
