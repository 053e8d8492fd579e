"""The TensorFlow backend's config work without TensorFlow: auto-complete from a signature's tensors by the rules of
Triton's TensorFlow backend, and the TF_* parameters, accelerators and backend config checked by name."""

from __future__ import annotations

import pytest

from nereid.backends.tensorflow.autocomplete import batching_hint, complete_config
from nereid.backends.tensorflow.options import backend_options, model_options
from nereid.backends.tensorflow.signature import ModelTensor
from nereid.config.model_config import ModelConfig, mc, parse_pbtxt
from nereid.core.errors import NereidError, Status

X = ModelTensor("x", "serving_default_x:0", "DT_FLOAT", (-1, 8))
Y = ModelTensor("y", "StatefulPartitionedCall:0", "DT_FLOAT", (-1, 3))
Z = ModelTensor("z", "StatefulPartitionedCall:1", "DT_INT64", (-1,))


def _config(text: str = "") -> ModelConfig:
    return parse_pbtxt(f'name: "m"\n{text}', "m")


def _io(entries: object) -> list[tuple[str, int, list[int]]]:
    return [(e.name, e.data_type, list(e.dims)) for e in entries]  # type: ignore[attr-defined]


def test_a_signature_that_batches_gets_the_default_max_batch_size_and_dynamic_batching() -> None:
    config = _config()
    complete_config(config, [X], [Y, Z])
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert _io(config.input) == [("x", mc.TYPE_FP32, [8])]
    # A scalar per batch item shows as dims [1] reshaped to nothing.
    assert _io(config.output) == [("y", mc.TYPE_FP32, [3]), ("z", mc.TYPE_INT64, [1])]
    assert config.output[1].HasField("reshape") and list(config.output[1].reshape.shape) == []


def test_default_max_batch_size_zero_or_a_fixed_first_dimension_means_no_batching() -> None:
    config = _config()
    complete_config(config, [X], [Y], default_max_batch_size=0)
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert _io(config.input) == [("x", mc.TYPE_FP32, [-1, 8])]
    fixed = ModelTensor("x", "x:0", "DT_FLOAT", (2, 8))
    config = _config()
    complete_config(config, [fixed], [Y])
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 8]


def test_config_dims_as_long_as_the_model_rank_say_it_does_not_batch() -> None:
    config = _config('input [{ name: "x" dims: [-1, 8] }]')
    assert not batching_hint(config, [X], [Y])
    complete_config(config, [X], [Y])
    assert config.max_batch_size == 0
    assert _io(config.input) == [("x", mc.TYPE_FP32, [-1, 8])] and _io(config.output) == [("y", mc.TYPE_FP32, [-1, 3])]
    assert batching_hint(_config('input [{ name: "x" dims: [8] }]'), [X], [Y])
    assert batching_hint(_config('input [{ name: "x" }]'), [X], [Y])  # named without dims: the signature decides
    assert not batching_hint(_config('input [{ name: "other" dims: [8] }]'), [X], [Y])


def test_config_tensors_that_contradict_each_other_are_refused() -> None:
    config = _config('input [{ name: "x" dims: [8] }]\noutput [{ name: "y" dims: [-1, 3] }]')
    with pytest.raises(NereidError) as caught:
        complete_config(config, [X], [Y])
    assert caught.value.status == Status.INVALID_ARG
    assert "[model 'm']" in caught.value.message and "tensor 'y'" in caught.value.message


def test_max_batch_size_on_a_signature_that_cannot_batch_is_refused_naming_the_tensor() -> None:
    fixed = ModelTensor("x", "x:0", "DT_FLOAT", (1, 8))
    with pytest.raises(NereidError) as caught:
        complete_config(_config("max_batch_size: 8"), [fixed], [Y])
    assert "max_batch_size 8" in caught.value.message and "x [1,8]" in caught.value.message


def test_a_tensor_of_unknown_rank_needs_dims_in_the_config() -> None:
    unknown = ModelTensor("x", "x:0", "DT_STRING", None)
    with pytest.raises(NereidError) as caught:
        complete_config(_config(), [unknown], [Y])
    assert "tensor 'x'" in caught.value.message and "declare its dims" in caught.value.message
    config = _config('input [{ name: "x" dims: [2] }]')
    complete_config(config, [unknown], [Y])
    assert _io(config.input) == [("x", mc.TYPE_STRING, [2])]


def test_listed_outputs_are_completed_and_the_others_left_out() -> None:
    config = _config('output [{ name: "z" }]\ninput [{ name: "x" data_type: TYPE_FP16 }]')
    complete_config(config, [X], [Y, Z])
    assert [o.name for o in config.output] == ["z"]
    assert config.input[0].data_type == mc.TYPE_FP16  # what the config says stays; loading checks it


def test_explicit_max_batch_size_one_gets_no_dynamic_batcher_and_controls_are_not_inputs() -> None:
    control = ModelTensor("START", "start:0", "DT_INT32", (-1, 1))
    config = _config(
        "max_batch_size: 1\nsequence_batching { control_input [{ name: \"START\" "
        "control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }] }"
    )
    complete_config(config, [X, control], [Y])
    assert not config.HasField("dynamic_batching")
    assert [i.name for i in config.input] == ["x"]


def test_parameters_are_parsed_and_bad_ones_named() -> None:
    options = model_options(_config(
        'parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "2" } }\n'
        'parameters { key: "TF_USE_PER_SESSION_THREADS" value { string_value: "On" } }\n'
        'parameters { key: "MAX_SESSION_SHARE_COUNT" value { string_value: "3" } }\n'
        'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "scaled" } }\n'
        "optimization { graph { level: 1 } }"
    ))
    assert (options.intra_threads, options.inter_threads, options.per_session_threads) == (2, 0, True)
    assert (options.share_count, options.signature_def, options.graph_level) == (3, "scaled", 1)
    for key, value in (("TF_NUM_INTRA_THREADS", "-1"), ("TF_NUM_INTER_THREADS", "many"), ("MAX_SESSION_SHARE_COUNT", "0")):
        with pytest.raises(NereidError) as caught:
            model_options(_config(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'))
        assert f"parameter '{key}'" in caught.value.message and f"'{value}'" in caught.value.message


def test_accelerators_are_checked_as_triton_checks_them() -> None:
    gpu = "optimization {{ execution_accelerators {{ gpu_execution_accelerator [{}] }} }}"
    assert model_options(_config(gpu.format('{ name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }'))).tensorrt
    assert model_options(_config(gpu.format('{ name: "auto_mixed_precision" }'))).gpu_accelerators == ["auto_mixed_precision"]
    for bad, words in (
        (gpu.format('{ name: "tensorrt" }, { name: "auto_mixed_precision" }'), "cannot be combined"),
        (gpu.format('{ name: "openvino" }'), "'openvino'"),
        (gpu.format('{ name: "tensorrt" parameters { key: "precision" value: "FP16" } }'), "unknown parameter 'precision'"),
        ('optimization { execution_accelerators { cpu_execution_accelerator [{ name: "openvino" }] } }', "no CPU"),
    ):
        with pytest.raises(NereidError) as caught:
            model_options(_config(bad))
        assert words in caught.value.message, caught.value.message


def test_backend_config_gives_default_max_batch_size_and_gpu_memory_fraction() -> None:
    options = backend_options({"backend_config": {"tensorflow": {"gpu-memory-fraction": "0.5"}, "": {"default-max-batch-size": "8"}}})
    assert (options.default_max_batch_size, options.gpu_memory_fraction, options.allow_soft_placement) == (8, 0.5, True)
    assert backend_options({}).default_max_batch_size == 4
    for settings in ({"gpu-memory-fraction": "1.5"}, {"version": "1"}, {"default-max-batch-size": "x"}):
        with pytest.raises(NereidError):
            backend_options({"backend_config": {"tensorflow": settings}})
