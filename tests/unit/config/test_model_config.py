"""config.pbtxt parsing, normalisation, validation and version selection, without a server or a framework."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from nereid.config.model_config import (
    config_from_json,
    config_to_json_dict,
    mc,
    normalize,
    parse_pbtxt,
    platform_of,
    read_config_file,
    validate,
)
from nereid.core.errors import NereidError, Status
from nereid.repository.layout import fingerprint, scan_repositories, select_versions, version_folders
from nereid.repository.manager import decode_file_overrides

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] label_filename: "labels.txt" }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def _complete(text: str, name: str = "simple") -> object:
    config = parse_pbtxt(text, "config.pbtxt")
    normalize(config, name)
    validate(config, name)
    return config


def _invalid(text: str, name: str = "m") -> NereidError:
    config = parse_pbtxt(text, "config.pbtxt")
    normalize(config, name)
    with pytest.raises(NereidError) as caught:
        validate(config, name)
    assert caught.value.status is Status.INVALID_ARG
    return caught.value


# -- parsing -----------------------------------------------------------------------------------------
def test_pbtxt_parses_into_tritons_model_config_message() -> None:
    config = parse_pbtxt(SIMPLE, "simple/config.pbtxt")
    assert isinstance(config, mc.ModelConfig)
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == mc.TYPE_INT32
    assert list(config.input[0].dims) == [16]
    assert config.instance_group[0].count == 2
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.parameters["intra_op_thread_count"].string_value == "1"


def test_pbtxt_syntax_error_names_the_file_and_position() -> None:
    with pytest.raises(NereidError) as caught:
        parse_pbtxt('name: "x"\nmax_batch_size: eight\n', "/models/x/config.pbtxt")
    assert caught.value.status is Status.INVALID_ARG
    assert "/models/x/config.pbtxt" in caught.value.message
    assert "2:" in caught.value.message  # line of the error


def test_pbtxt_unknown_field_is_an_error_naming_the_field() -> None:
    with pytest.raises(NereidError) as caught:
        parse_pbtxt('name: "x"\nmax_batch: 4\n', "config.pbtxt")
    assert "max_batch" in caught.value.message


def test_reading_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NereidError) as caught:
        read_config_file(tmp_path / "config.pbtxt")
    assert str(tmp_path / "config.pbtxt") in caught.value.message


def test_config_json_override_parses_like_the_load_api_sends_it() -> None:
    config = config_from_json('{"backend": "onnxruntime", "max_batch_size": 2, "input": [{"name": "a", '
                              '"data_type": "TYPE_FP32", "dims": [3]}]}', "m")
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 2
    assert list(config.input[0].dims) == [3]


def test_config_json_override_with_an_unknown_field_is_invalid_and_names_the_model() -> None:
    with pytest.raises(NereidError) as caught:
        config_from_json('{"max_batch": 2}', "mymodel")
    assert caught.value.status is Status.INVALID_ARG
    assert "mymodel" in caught.value.message


# -- normalisation ------------------------------------------------------------------------------------
def test_normalize_fills_name_backend_and_tritons_defaults() -> None:
    config = _complete(SIMPLE.replace('name: "simple"', ""))
    assert config.name == "simple"
    assert config.backend == "onnxruntime"
    assert config.platform == "onnxruntime_onnx"
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1
    assert config.default_model_filename == "model.onnx"
    group = config.instance_group[0]
    assert (group.name, group.count, group.kind) == ("simple_0", 2, mc.ModelInstanceGroup.KIND_CPU)


def test_normalize_gives_backend_only_configs_the_onnx_platform() -> None:
    config = _complete('backend: "onnxruntime"\ninput { name: "a" data_type: TYPE_FP32 dims: [1] }')
    assert config.platform == "onnxruntime_onnx"
    assert platform_of(config) == "onnxruntime_onnx"


def test_normalize_adds_one_cpu_instance_and_names_several_groups() -> None:
    config = _complete('backend: "onnxruntime"')
    assert len(config.instance_group) == 1
    assert config.instance_group[0].count == 1
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    two = _complete('backend: "onnxruntime"\ninstance_group [{ count: 0 }, { kind: KIND_GPU gpus: [0] }]', "two")
    assert [g.name for g in two.instance_group] == ["two_0", "two_1"]
    assert two.instance_group[0].count == 1
    assert two.instance_group[1].kind == mc.ModelInstanceGroup.KIND_GPU


def test_groups_and_instances_are_named_as_triton_names_them() -> None:
    """Triton 2.51 (asked): no instance_group gives one group named after the model, its instance '<model>_0'; an
    unnamed group of the config's own is '<model>_<index>' even alone; an instance is '<group>_<index in group>'
    (Triton's L0_backend_python init_args model checks 'init_args_0_0')."""
    from nereid.backends.base import ModelContext
    from nereid.repository.model_version import instance_specs

    def names(text: str) -> tuple[list[str], list[str]]:
        config = _complete('backend: "python"\n' + text, "m")
        context = ModelContext("m", 1, config, Path("/r/m"), Path("/r/m/1"), Path("/r"))
        return [g.name for g in config.instance_group], [s.name for s in instance_specs(context)]

    assert names("") == (["m"], ["m_0"])
    assert names("instance_group [{ count: 2 kind: KIND_CPU }]") == (["m_0"], ["m_0_0", "m_0_1"])
    assert names("instance_group [{ count: 1 }, { count: 2 }]") == (["m_0", "m_1"], ["m_0_0", "m_1_0", "m_1_1"])
    assert names('instance_group [{ name: "g" count: 2 }]') == (["g"], ["g_0", "g_1"])


def test_normalize_keeps_an_explicit_version_policy_and_filename() -> None:
    config = _complete('backend: "onnxruntime"\ndefault_model_filename: "net.onnx"\nversion_policy { all {} }')
    assert config.default_model_filename == "net.onnx"
    assert config.version_policy.WhichOneof("policy_choice") == "all"


def test_normalize_sets_the_middle_priority_level_as_default() -> None:
    config = _complete('backend: "onnxruntime"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 5 }')
    assert config.dynamic_batching.default_priority_level == 3


# -- validation ---------------------------------------------------------------------------------------
def test_a_complete_config_validates() -> None:
    _complete(SIMPLE)


def test_config_name_must_match_the_model_folder() -> None:
    error = _invalid(SIMPLE, "other")
    assert "simple" in error.message and "other" in error.message


def test_config_without_backend_or_platform_is_invalid() -> None:
    error = _invalid('input { name: "a" data_type: TYPE_FP32 dims: [1] }')
    assert "backend" in error.message


def test_negative_max_batch_size_is_invalid() -> None:
    assert "max_batch_size" in _invalid('backend: "onnxruntime"\nmax_batch_size: -1').message


def test_zero_and_below_minus_one_dims_are_invalid_and_named() -> None:
    for dims in ("[0]", "[4, -2]"):
        error = _invalid(f'backend: "onnxruntime"\ninput {{ name: "IN" data_type: TYPE_FP32 dims: {dims} }}')
        assert "'IN'" in error.message and "-1" in error.message


def test_variable_dims_are_valid() -> None:
    _complete('backend: "onnxruntime"\ninput { name: "IN" data_type: TYPE_FP32 dims: [-1, 3] }', "m")


def test_input_without_dims_is_invalid() -> None:
    error = _invalid('backend: "onnxruntime"\ninput { name: "IN" data_type: TYPE_FP32 }')
    assert "'IN'" in error.message and "dims" in error.message


def test_tensor_without_data_type_is_invalid() -> None:
    error = _invalid('backend: "onnxruntime"\noutput { name: "OUT" dims: [1] }')
    assert "'OUT'" in error.message and "data_type" in error.message


def test_duplicate_input_names_are_invalid() -> None:
    text = 'backend: "onnxruntime"\n' + 'input { name: "A" data_type: TYPE_FP32 dims: [1] }\n' * 2
    assert "duplicate" in _invalid(text).message


def test_an_input_and_an_output_may_share_a_name() -> None:
    text = 'backend: "onnxruntime"\ninput { name: "A" data_type: TYPE_FP32 dims: [1] }\n'
    text += 'output { name: "A" data_type: TYPE_FP32 dims: [1] }\n'
    _complete(text, "m")


def test_reshape_must_keep_the_element_count() -> None:
    ok = 'backend: "onnxruntime"\ninput { name: "A" data_type: TYPE_FP32 dims: [6] reshape { shape: [2, 3] } }'
    _complete(ok, "m")
    error = _invalid(ok.replace("[2, 3]", "[2, 4]"))
    assert "reshape" in error.message and "'A'" in error.message


def test_scalar_reshape_of_a_single_element_is_valid() -> None:
    _complete('backend: "onnxruntime"\nmax_batch_size: 4\ninput { name: "A" data_type: TYPE_INT64 dims: [1] reshape { } }', "m")


def test_preferred_batch_size_above_max_batch_size_is_invalid() -> None:
    error = _invalid('backend: "onnxruntime"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }')
    assert "preferred" in error.message and "8" in error.message


# -- JSON rendering -----------------------------------------------------------------------------------
def test_json_rendering_uses_proto_names_and_numbers_for_64_bit_fields() -> None:
    rendered = config_to_json_dict(_complete(SIMPLE))
    assert rendered["name"] == "simple"
    assert rendered["max_batch_size"] == 8
    assert rendered["input"][0]["dims"] == [16]  # int64 dims are numbers, not strings
    assert rendered["input"][0]["data_type"] == "TYPE_INT32"
    assert rendered["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert rendered["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert rendered["instance_group"][0]["kind"] == "KIND_CPU"
    assert rendered["parameters"]["intra_op_thread_count"] == {"string_value": "1"}
    # Fields left at their defaults are still shown, as Triton shows them.
    assert rendered["output"][0]["is_shape_tensor"] is False
    assert rendered["input"][0]["optional"] is False


def test_json_rendering_round_trips_through_the_load_api_parser() -> None:
    import json

    original = _complete(SIMPLE)
    again = config_from_json(json.dumps(config_to_json_dict(original)), "simple")
    assert again == original


# -- version folders and version_policy -----------------------------------------------------------------
def _policy(text: str) -> object:
    return parse_pbtxt(f'backend: "onnxruntime"\n{text}', "config.pbtxt")


def test_only_numeric_version_folders_without_leading_zeros_count(tmp_path: Path) -> None:
    for name in ("1", "3", "10", "0", "007", "abc", "2b", "configs"):
        (tmp_path / name).mkdir()
    (tmp_path / "5").write_text("a file, not a folder")
    assert version_folders(tmp_path) == [0, 1, 3, 10]


def test_default_policy_serves_the_latest_version() -> None:
    assert select_versions(_policy(""), [1, 2, 3], "m") == [3]


def test_latest_policy_serves_the_highest_n_versions() -> None:
    assert select_versions(_policy("version_policy { latest { num_versions: 2 } }"), [1, 3, 2], "m") == [2, 3]
    assert select_versions(_policy("version_policy { latest { num_versions: 5 } }"), [1, 2], "m") == [1, 2]


def test_all_policy_serves_every_version() -> None:
    assert select_versions(_policy("version_policy { all { } }"), [1, 2, 7], "m") == [1, 2, 7]


def test_specific_policy_serves_the_listed_versions_that_exist() -> None:
    policy = _policy("version_policy { specific { versions: [3, 1] } }")
    assert select_versions(policy, [1, 2, 3], "m") == [1, 3]
    # A listed version without a folder is reported and skipped, as Triton does.
    assert select_versions(_policy("version_policy { specific { versions: [1, 9] } }"), [1, 2], "m") == [1]


def test_no_version_to_serve_is_an_error_naming_the_model() -> None:
    with pytest.raises(NereidError) as caught:
        select_versions(_policy(""), [], "lonely")
    assert "lonely" in caught.value.message and "version" in caught.value.message
    with pytest.raises(NereidError):
        select_versions(_policy("version_policy { specific { versions: [4] } }"), [1, 2], "m")


# -- repository scanning -----------------------------------------------------------------------------
def test_scan_finds_model_folders_and_their_config_files(tmp_path: Path) -> None:
    (tmp_path / "with_config" / "1").mkdir(parents=True)
    (tmp_path / "with_config" / "config.pbtxt").write_text("")
    (tmp_path / "no_config" / "1").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "README.md").write_text("not a model")
    sources = scan_repositories([tmp_path])
    assert sorted(sources) == ["no_config", "with_config"]
    assert sources["with_config"].config_path == tmp_path / "with_config" / "config.pbtxt"
    assert sources["no_config"].config_path is None


def test_model_config_name_picks_configs_folder_file_and_falls_back(tmp_path: Path) -> None:
    for model in ("custom", "plain"):
        (tmp_path / model / "configs").mkdir(parents=True)
        (tmp_path / model / "config.pbtxt").write_text("")
    (tmp_path / "custom" / "configs" / "small.pbtxt").write_text("")
    sources = scan_repositories([tmp_path], "small")
    assert sources["custom"].config_path == tmp_path / "custom" / "configs" / "small.pbtxt"
    assert sources["plain"].config_path == tmp_path / "plain" / "config.pbtxt"
    assert scan_repositories([tmp_path])["custom"].config_path == tmp_path / "custom" / "config.pbtxt"


def test_models_from_several_repositories_are_merged_and_duplicates_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "m1").mkdir(parents=True)
    (second / "m2").mkdir(parents=True)
    assert sorted(scan_repositories([first, second])) == ["m1", "m2"]
    (second / "m1").mkdir()
    with pytest.raises(NereidError) as caught:
        scan_repositories([first, second])
    assert "m1" in caught.value.message


def test_missing_repository_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NereidError) as caught:
        scan_repositories([tmp_path / "nowhere"])
    assert "nowhere" in caught.value.message


def test_fingerprint_changes_when_a_model_file_changes(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    model = tmp_path / "1" / "model.onnx"
    model.write_bytes(b"one")
    before = fingerprint(tmp_path)
    assert fingerprint(tmp_path) == before
    model.write_bytes(b"three")
    os.utime(model, ns=(1, 1))
    changed = fingerprint(tmp_path)
    assert changed != before
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.onnx").write_bytes(b"x")
    assert fingerprint(tmp_path) != changed


# -- load API file overrides -------------------------------------------------------------------------
def test_file_overrides_decode_base64_strings_and_raw_bytes() -> None:
    files = decode_file_overrides(
        {"config": "{}", "file:1/model.onnx": base64.b64encode(b"onnx bytes").decode(), "file:2/x": b"raw"}
    )
    assert files == {"1/model.onnx": b"onnx bytes", "2/x": b"raw"}


def test_file_override_that_is_not_base64_is_invalid() -> None:
    with pytest.raises(NereidError) as caught:
        decode_file_overrides({"file:1/model.onnx": "not base64!"})
    assert caught.value.status is Status.INVALID_ARG
    assert "file:1/model.onnx" in caught.value.message
