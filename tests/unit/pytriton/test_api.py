"""nereid.pytriton without a server: TritonConfig fields as Nereid settings, the generated config.pbtxt, and the
decorators' wrapping (method binding, context lookup, padding) on plain calls."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from google.protobuf import text_format

from nereid.config.model_config import mc
from nereid.pytriton._model_spec import config_text, model_spec
from nereid.pytriton._settings import server_settings
from nereid.pytriton.decorators import ConstantPadder, TritonContext, batch, get_model_config, group_by_values
from nereid.pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError
from nereid.pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from nereid.pytriton.proxy.types import Request
from nereid.pytriton.triton import TritonConfig


def test_triton_config_fields_become_nereid_settings(tmp_path: pathlib.Path) -> None:
    config = TritonConfig(
        id="fn", http_port=9100, grpc_port=9101, allow_metrics=False, log_verbose=2, exit_timeout_secs=7,
        http_header_forward_pattern="x-.*", cache_config=["local,size=4096"], strict_readiness=False,
        buffer_manager_thread_count=4,
    )  # fmt: skip
    settings = server_settings(config, tmp_path, (["statistics", "logging"], "triton-access-token", "secret"))
    assert settings.model_control_mode == "explicit" and settings.model_repositories == [tmp_path.resolve()]
    assert (settings.server_id, settings.http_port, settings.grpc_port) == ("fn", 9100, 9101)
    assert settings.allow_metrics is False and settings.log_verbose == 2 and settings.exit_timeout_secs == 7
    assert settings.http_header_forward_pattern == "x-.*" and settings.strict_readiness is False
    assert settings.cache_config == ("local", {"size": "4096"})
    assert "--buffer-manager-thread-count" in settings.ignored_flags
    for restricted in (settings.http_restricted_apis, settings.grpc_restricted_protocols):
        assert restricted[0].apis == frozenset({"statistics", "logging"})
        assert (restricted[0].header, restricted[0].value) == ("triton-access-token", "secret")


def test_a_user_model_repository_is_served_and_loaded_at_start(tmp_path: pathlib.Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    settings = server_settings(TritonConfig(model_repository=user), tmp_path / "store", None)
    assert settings.model_repositories[0] == user.resolve() and settings.load_models == ["*"]
    assert settings.http_restricted_apis == []


def test_generated_config_carries_every_model_config_field() -> None:
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=250, preferred_batch_size=[2, 4], preserve_ordering=True, priority_levels=2,
        default_priority_level=1, default_queue_policy=QueuePolicy(timeout_action=TimeoutAction.DELAY, max_queue_size=9),
        priority_queue_policy={2: QueuePolicy(default_timeout_microseconds=100, allow_timeout_override=True)},
    )  # fmt: skip
    spec = model_spec(
        "m", 3, 2,
        [Tensor(shape=(-1,), dtype=np.bytes_), Tensor(name="w", shape=(2, 2), dtype=np.float16, optional=True)],
        [Tensor(shape=(1,), dtype=np.int64)],
        ModelConfig(max_batch_size=16, batcher=batcher, response_cache=True, decoupled=True),
    )  # fmt: skip
    config = text_format.Parse(config_text(spec), mc.ModelConfig())
    assert config.backend == "python_function" and config.max_batch_size == 16
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in config.input] == [
        ("INPUT_1", "TYPE_STRING", [-1], False), ("w", "TYPE_FP16", [2, 2], True)]  # fmt: skip
    assert [(t.name, mc.DataType.Name(t.data_type)) for t in config.output] == [("OUTPUT_1", "TYPE_INT64")]
    db = config.dynamic_batching
    assert db.max_queue_delay_microseconds == 250 and list(db.preferred_batch_size) == [2, 4] and db.preserve_ordering
    assert db.priority_levels == 2 and db.default_priority_level == 1
    assert db.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY and db.default_queue_policy.max_queue_size == 9
    assert db.priority_queue_policy[2].default_timeout_microseconds == 100 and db.priority_queue_policy[2].allow_timeout_override
    assert config.instance_group[0].count == 2 and config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.model_transaction_policy.decoupled and config.response_cache.enable
    without = text_format.Parse(config_text(model_spec("n", 1, 1, [], [], ModelConfig(batching=False))), mc.ModelConfig())
    assert without.max_batch_size == 0 and not without.HasField("dynamic_batching")


def test_bad_priority_settings_are_refused_with_pytritons_messages() -> None:
    spec = model_spec("m", 1, 1, [], [], ModelConfig(batcher=DynamicBatcher(priority_levels=1, default_priority_level=2)))
    with pytest.raises(PyTritonBadParameterError, match="default_priority_level` must be between 1 and 1"):
        config_text(spec)
    spec = model_spec("m", 1, 1, [], [], ModelConfig(batcher=DynamicBatcher(priority_queue_policy={1: QueuePolicy()})))
    with pytest.raises(PyTritonBadParameterError, match="Provide the `priority_levels`"):
        config_text(spec)


def _bind(function: object, spec_outputs: list[Tensor], batching: bool = True) -> None:
    context = TritonContext()
    context.model_configs[function] = model_spec(  # type: ignore[index]
        "m", 1, 1, [], spec_outputs, ModelConfig(batching=batching, max_batch_size=8)
    )
    target = function.__self__ if hasattr(function, "__self__") else function
    target.__triton_context__ = context  # type: ignore[union-attr]


def test_batch_on_a_method_splits_results_and_converts_a_tuple_by_output_order() -> None:
    class Model:
        @batch
        def infer(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return x * 2, x + 1

    model = Model()
    _bind(model.infer, [Tensor(name="double", shape=(1,), dtype=np.int32), Tensor(name="inc", shape=(1,), dtype=np.int32)])
    requests = [Request({"x": np.array([[1], [2]])}), Request({"x": np.array([[3]])})]
    results = model.infer(requests)
    assert [r["double"].tolist() for r in results] == [[[2], [4]], [[6]]]
    assert [r["inc"].tolist() for r in results] == [[[2], [3]], [[4]]]
    assert get_model_config(model.infer, model).model_name == "m"


def test_group_by_values_keeps_sample_order_and_pads_groups_with_a_constant_padder() -> None:
    @batch
    @group_by_values("key", pad_fn=ConstantPadder(-1))
    def infer(key: np.ndarray, tokens: np.ndarray) -> dict[str, np.ndarray]:
        width = 1 if key[0][0] == 1 else 3  # each group returns a different width: the padder evens them out
        return {"out": np.full((len(key), width), key[0][0], dtype=np.int32)}

    _bind(infer, [Tensor(name="out", shape=(-1,), dtype=np.int32)])
    request = Request({"key": np.array([[2], [1], [2]]), "tokens": np.zeros((3, 1))})
    (result,) = infer([request])
    assert result["out"].tolist() == [[2, 2, 2], [1, -1, -1], [2, 2, 2]]


def test_group_by_values_before_batch_is_refused() -> None:
    @group_by_values("key")
    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return inputs

    _bind(infer, [])
    with pytest.raises(PyTritonRuntimeError, match="must be used after the @batch decorator"):
        infer(key=np.array([[1]]))


def test_sagemaker_fields_turn_on_the_sagemaker_endpoint(tmp_path: pathlib.Path) -> None:
    settings = server_settings(TritonConfig(allow_sagemaker=True, sagemaker_port=18080), tmp_path, None)
    assert settings.sagemaker is not None and settings.sagemaker.port == 18080
