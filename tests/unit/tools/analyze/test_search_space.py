"""`nereid analyze` search space: variants, how they are written into a config, and the grid for a model."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from nereid.tools.analyze.model_config import config_from_server_json, config_to_load_json, config_to_pbtxt
from nereid.tools.analyze.search_space import SearchSpace, Variant, apply_variant, variant_of_config
from nereid.tools.analyze.settings import AnalyzeSettings

ONNX = """
name: "mlp" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { name: "g" kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 50 priority_levels: 2 default_priority_level: 1 }
"""

PYTHON = """
name: "add_sub" backend: "python" max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _settings(**kwargs: object) -> AnalyzeSettings:
    return AnalyzeSettings("m", **kwargs)  # type: ignore[arg-type]


def test_variant_names_say_every_knob_and_are_file_safe() -> None:
    v = Variant(8, True, 100, (4, 8), 2, 1)
    assert v.name == "mbs8_db_q100us_pref4-8_i2_t1"
    assert Variant(8, False, 0, (), 1, None).name == "mbs8_nodb_i1"
    assert "2 instance(s)" in v.describe() and "preferred [4, 8]" in v.describe()


def test_apply_variant_sets_the_knobs_and_keeps_everything_else() -> None:
    base = _config(ONNX)
    config = apply_variant(base, Variant(4, True, 200, (4,), 3, 2))
    assert config.max_batch_size == 4
    assert config.dynamic_batching.max_queue_delay_microseconds == 200
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config.dynamic_batching.priority_levels == 2  # other batching fields survive
    assert len(config.instance_group) == 1 and config.instance_group[0].count == 3
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU and config.instance_group[0].name == "g"
    assert config.parameters["intra_op_thread_count"].string_value == "2"
    assert [i.name for i in config.input] == ["input"] and [o.name for o in config.output] == ["probabilities"]
    assert base.instance_group[0].count == 1 and base.max_batch_size == 8  # the base is not touched
    off = apply_variant(base, Variant(8, False, 0, (), 1, None))
    assert not off.HasField("dynamic_batching") and "intra_op_thread_count" not in off.parameters


def test_variant_config_round_trips_through_pbtxt_and_the_load_json() -> None:
    config = apply_variant(_config(PYTHON), Variant(4, True, 0, (), 2, None))
    assert text_format.Parse(config_to_pbtxt(config), mc.ModelConfig()) == config
    import json

    assert config_from_server_json(json.loads(config_to_load_json(config))) == config
    # A config without dynamic_batching fields set still says dynamic batching is on.
    assert "dynamic_batching" in config_to_load_json(config)


def test_variant_of_config_reads_the_models_own_point() -> None:
    v = variant_of_config(_config(ONNX))
    assert v == Variant(8, True, 50, (), 1, None)
    assert variant_of_config(_config(PYTHON)) == Variant(4, False, 0, (), 1, None)


def test_default_space_for_onnx_has_threads_batching_and_instances() -> None:
    notes: list[str] = []
    space = SearchSpace(_settings(), _config(ONNX), notes)
    dims = {d.name: d.values for d in space.dimensions}
    assert dims["dynamic_batching"] == (False, True)
    assert dims["max_batch_size"] == (2, 4, 8, 16, 32, 64)
    assert dims["intra_op_threads"][0] == 1 and None not in dims["intra_op_threads"]
    assert not notes


def test_without_dynamic_batching_max_batch_size_is_not_varied() -> None:
    space = SearchSpace(_settings(max_batch_sizes=[2, 4, 8], instance_counts=[1], max_queue_delays_us=[0]), _config(PYTHON), [])
    variants = space.all_variants()
    no_batching = [v for v in variants if not v.dynamic_batching]
    assert no_batching == [Variant(4, False, 0, (), 1, None)]  # the model's own max_batch_size
    assert sorted(v.max_batch_size for v in variants if v.dynamic_batching) == [2, 4, 8]
    assert len(variants) == len(set(variants)) == 4


def test_python_model_ignores_intra_op_threads_with_a_note() -> None:
    notes: list[str] = []
    space = SearchSpace(_settings(intra_op_threads=[1, 2]), _config(PYTHON), notes)
    assert {d.name: d.values for d in space.dimensions}["intra_op_threads"] == (None,)
    assert any("intra-op-threads" in n for n in notes)


def test_max_batch_size_zero_and_sequence_models_never_get_dynamic_batching() -> None:
    unbatched = _config(PYTHON)
    unbatched.max_batch_size = 0
    notes: list[str] = []
    space = SearchSpace(_settings(dynamic_batching=[True], max_batch_sizes=[8]), unbatched, notes)
    assert all(not v.dynamic_batching and v.max_batch_size == 0 for v in space.all_variants())
    assert len(notes) == 2
    sequence = _config(PYTHON)
    sequence.sequence_batching.max_sequence_idle_microseconds = 1000
    assert all(not v.dynamic_batching for v in SearchSpace(_settings(), sequence, []).all_variants())


def test_preferred_sizes_above_the_max_batch_size_are_skipped() -> None:
    space = SearchSpace(
        _settings(max_batch_sizes=[2, 8], preferred_batch_sizes=["none", "max", "4"], instance_counts=[1], max_queue_delays_us=[0], dynamic_batching=[True]),
        _config(PYTHON),
        [],
    )
    prefs = sorted((v.max_batch_size, v.preferred_batch_sizes) for v in space.all_variants())
    assert prefs == [(2, ()), (2, (2,)), (8, ()), (8, (4,)), (8, (8,))]


def test_client_batch_size_removes_smaller_max_batch_sizes() -> None:
    space = SearchSpace(_settings(max_batch_sizes=[2, 4, 8], batch_size=4), _config(PYTHON), [])
    assert {d.name: d.values for d in space.dimensions}["max_batch_size"] == (4, 8)


def test_neighbours_step_one_knob_at_a_time_and_nearest_point_snaps() -> None:
    space = SearchSpace(_settings(max_batch_sizes=[2, 4, 8], instance_counts=[1, 2], max_queue_delays_us=[0, 100]), _config(PYTHON), [])
    start = space.nearest_point(Variant(5, True, 90, (), 2, None))
    assert space.variant_at(start) == Variant(4, True, 100, (), 2, None)
    for neighbour in space.neighbours(start):
        assert sum(1 for a, b in zip(neighbour, start) if a != b) == 1
    assert len(space.neighbours(start)) == 5  # batching off, mbs 2, mbs 8, delay 0, 1 instance
