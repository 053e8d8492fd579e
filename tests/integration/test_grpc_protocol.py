"""The gRPC protocol (GRPCInferenceService with Triton's extensions, and grpc.health.v1) against a real server,
through the official tritonclient.grpc and tritonclient.grpc.aio clients and the generated stubs."""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.utils.shared_memory as shm
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, without_llm
from tests.integration.protocol_models import (
    ADD_SUB_LABELS,
    DTYPES,
    HTTP_TRACE_DEFAULTS,
    TRITON_EXTENSIONS,
    as_bytes_array,
    build_protocol_repository,
    echo_model,
    sample,
)
from tests.servers import RunningServer, start_nereid

# gRPC answers every setting as a list of strings.
TRACE_DEFAULTS = {k: v if isinstance(v, list) else [v] for k, v in HTTP_TRACE_DEFAULTS.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = build_protocol_repository(tmp_path_factory.mktemp("protocol_repository"))
    running = start_nereid([EXAMPLES, repository], *without_llm(repository), "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _echo_input(datatype: str, data: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def _status(excinfo: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(excinfo.value.status())


# -- health and metadata -----------------------------------------------------------------------------
def test_health_rpcs_report_server_and_model_readiness(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "7")
    assert not client.is_model_ready("no_such_model")


def test_standard_grpc_health_service_reports_serving(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference", "inference.GRPCInferenceService", "any.other.Name"):  # any name, as Triton
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_server_metadata_lists_tritons_extensions(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert isinstance(metadata, pb.ServerMetadataResponse)
    assert metadata.name == "triton" and metadata.version
    assert TRITON_EXTENSIONS <= set(metadata.extensions)


def test_model_metadata_is_a_protobuf_with_batch_dimension(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("simple")
    assert isinstance(metadata, pb.ModelMetadataResponse)
    assert (metadata.name, list(metadata.versions), metadata.platform) == ("simple", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]
    for datatype in DTYPES:
        echo = client.get_model_metadata(echo_model(datatype), "1")
        assert (echo.inputs[0].datatype, echo.outputs[0].datatype) == (datatype, datatype)
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_model_metadata("no_such_model")
    assert _status(excinfo) == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'no_such_model' is not found" in excinfo.value.message()


def test_model_config_is_the_model_config_protobuf(client: grpcclient.InferenceServerClient) -> None:
    response = client.get_model_config("simple")
    assert isinstance(response, pb.ModelConfigResponse)
    config = response.config
    assert (config.name, config.platform, config.max_batch_size) == ("simple", "onnxruntime_onnx", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", mc.TYPE_INT32, [16]),
        ("INPUT1", mc.TYPE_INT32, [16]),
    ]
    assert config.output[0].label_filename == "simple_labels.txt"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    as_json = client.get_model_config("simple_string", as_json=True)
    assert as_json["config"]["input"][0]["data_type"] == "TYPE_STRING"
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_model_config("simple", "7")
    assert _status(excinfo) == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'simple' version 7 is not found" in excinfo.value.message()


# -- inference -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("datatype", DTYPES)
def test_inference_round_trips_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    result = client.infer(echo_model(datatype), [_echo_input(datatype, data)])
    output = result.get_output("OUTPUT0")
    assert (output.datatype, list(output.shape)) == (datatype, [2, 3])
    received = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        np.testing.assert_array_equal(as_bytes_array(received), data)
    else:
        assert received.dtype == data.dtype
        np.testing.assert_array_equal(received, data)


def test_typed_contents_are_accepted_in_place_of_raw_contents(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    fields = {
        "BOOL": "bool_contents",
        "INT8": "int_contents",
        "INT32": "int_contents",
        "INT64": "int64_contents",
        "UINT16": "uint_contents",
        "UINT64": "uint64_contents",
        "FP32": "fp32_contents",
        "FP64": "fp64_contents",
        "BYTES": "bytes_contents",
    }
    for datatype, field in fields.items():
        data = sample(datatype)
        request = pb.ModelInferRequest(model_name=echo_model(datatype))
        tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
        getattr(tensor.contents, field).extend(data.reshape(-1).tolist())
        response = stub.ModelInfer(request, timeout=10)
        (raw,) = response.raw_output_contents
        if datatype == "BYTES":
            result = grpcclient.deserialize_bytes_tensor(raw).reshape(2, 3)
        else:
            result = np.frombuffer(raw, dtype=data.dtype).reshape(2, 3)
        np.testing.assert_array_equal(result, data, err_msg=datatype)


def test_only_requested_outputs_are_returned(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", _simple_inputs(a, a), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))
    assert [o.name for o in client.infer("simple", _simple_inputs(a, a)).get_response().outputs] == [
        "OUTPUT0",
        "OUTPUT1",
    ]


def test_request_id_and_parameters_travel_with_the_request(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), np.int32)
    result = client.infer(
        "simple", _simple_inputs(a, a), request_id="grpc-7", parameters={"custom": "x", "count": 3, "flag": True}
    )
    response = result.get_response()
    assert response.id == "grpc-7"
    assert (response.model_name, response.model_version) == ("simple", "1")
    assert len(response.parameters) == 0  # an ONNX model adds no response parameters
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert client.infer("simple", _simple_inputs(a, a)).get_response().id == ""


def test_numbered_requests_of_one_shape_each_answer_with_their_own_id_and_data(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Their headers differ only by the id, which the repeated-header decoding cuts out and puts back."""
    for i in range(6):
        a = np.full((1, 16), i, np.int32)
        result = client.infer("simple", _simple_inputs(a, a), request_id=f"n-{i}")
        assert result.get_response().id == f"n-{i}"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert client.infer("simple", _simple_inputs(a, a)).get_response().id == ""


def test_grpc_message_compression_is_accepted(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("simple", _simple_inputs(a, a), compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)


def test_classification_returns_top_k_values_indices_and_labels(client: grpcclient.InferenceServerClient) -> None:
    a = np.zeros((2, 16), dtype=np.int32)
    a[0, :3] = [3, 9, 1]
    a[1, 5] = 7
    result = client.infer(
        "simple",
        _simple_inputs(a, np.zeros_like(a)),
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)],
    )
    output = result.get_output("OUTPUT0")
    assert (output.datatype, list(output.shape)) == ("BYTES", [2, 2])
    np.testing.assert_array_equal(
        result.as_numpy("OUTPUT0"),
        np.array([[b"9:1:label_1", b"3:0:label_0"], [b"7:5:label_5", b"0:0:label_0"]], dtype=object),
    )
    values = np.array([[0.5, 2.0, 1.0, -1.0]], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.zeros_like(values))
    result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == [f"2.000000:1:{ADD_SUB_LABELS[1]}".encode()]


# -- statistics ------------------------------------------------------------------------------------------
def test_statistics_count_inferences_in_tritons_schema(client: grpcclient.InferenceServerClient) -> None:
    def stats() -> Any:
        response = client.get_inference_statistics("echo_int16")
        assert isinstance(response, pb.ModelStatisticsResponse)
        (entry,) = response.model_stats
        return entry

    before = stats()
    assert (before.name, before.version) == ("echo_int16", "1")
    data = sample("INT16")
    for _ in range(2):
        client.infer("echo_int16", [_echo_input("INT16", data)])
    after = stats()
    assert after.inference_stats.success.count == before.inference_stats.success.count + 2
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    assert after.inference_stats.fail.count == before.inference_stats.fail.count
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(after.inference_stats, phase).count == getattr(before.inference_stats, phase).count + 2
    assert after.inference_count == before.inference_count + 4
    assert after.execution_count == before.execution_count + 2
    assert after.last_inference > 0
    assert 2 in {b.batch_size for b in after.batch_stats}
    as_json = client.get_inference_statistics(as_json=True)
    assert {"simple", "echo_int16"} <= {entry["name"] for entry in as_json["model_stats"]}
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_inference_statistics("no_such_model")
    assert _status(excinfo) == "StatusCode.INVALID_ARGUMENT"
    assert "requested model 'no_such_model' is not available" in excinfo.value.message()
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_inference_statistics("simple", "9")
    assert "requested model version is not available for model 'simple'" in excinfo.value.message()


# -- shared memory ---------------------------------------------------------------------------------------
def test_system_shared_memory_feeds_inputs_and_receives_outputs(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    in_key, out_key = f"/nereid_grpc_in_{os.getpid()}", f"/nereid_grpc_out_{os.getpid()}"
    in_handle = shm.create_shared_memory_region("grpc_in", in_key, 128)
    out_handle = shm.create_shared_memory_region("grpc_out", out_key, 128)
    try:
        shm.set_shared_memory_region(in_handle, [a, b])
        client.register_system_shared_memory("grpc_in", in_key, 128)
        client.register_system_shared_memory("grpc_out", out_key, 128)
        status = client.get_system_shared_memory_status()
        assert isinstance(status, pb.SystemSharedMemoryStatusResponse)
        assert set(status.regions) == {"grpc_in", "grpc_out"}
        region = status.regions["grpc_in"]
        assert (region.name, region.key, region.offset, region.byte_size) == ("grpc_in", in_key, 0, 128)
        assert set(client.get_system_shared_memory_status("grpc_out").regions) == {"grpc_out"}

        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("grpc_in", 64)
        inputs[1].set_shared_memory("grpc_in", 64, offset=64)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("grpc_out", 64)
        outputs[1].set_shared_memory("grpc_out", 64, offset=64)
        result = client.infer("simple", inputs, outputs=outputs)
        assert [o.name for o in result.get_response().outputs] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64), a - b)

        # One input from shared memory and one as raw contents, one output to a region and one in the response.
        mixed = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        mixed[0].set_shared_memory("grpc_in", 64)
        mixed[1].set_data_from_numpy(np.full((1, 16), 100, dtype=np.int32))
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("grpc_out", 64)
        result = client.infer("simple", mixed, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 100)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), a + 100)

        client.unregister_system_shared_memory("grpc_out")
        assert set(client.get_system_shared_memory_status().regions) == {"grpc_in"}
        with pytest.raises(InferenceServerException) as excinfo:
            client.get_system_shared_memory_status("grpc_out")
        assert _status(excinfo) == "StatusCode.NOT_FOUND"
        client.unregister_system_shared_memory()
        assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_cuda_shared_memory_register_is_refused_as_unimplemented(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        client.register_cuda_shared_memory("cuda_region", b"\0" * 64, 0, 64)
    assert _status(excinfo) == "StatusCode.UNIMPLEMENTED"
    assert "CUDA shared memory is not supported" in excinfo.value.message()
    assert len(client.get_cuda_shared_memory_status().regions) == 0
    client.unregister_cuda_shared_memory()


# -- logging and trace settings ----------------------------------------------------------------------------
def test_log_settings_can_be_read_and_updated(client: grpcclient.InferenceServerClient) -> None:
    original = client.get_log_settings(as_json=True)["settings"]
    assert set(original) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    assert original["log_verbose_level"] == {"uint32_param": 0} or original["log_verbose_level"] == {}
    try:
        response = client.update_log_settings({"log_verbose_level": 3, "log_warning": False})
        assert isinstance(response, pb.LogSettingsResponse)
        assert response.settings["log_verbose_level"].uint32_param == 3
        assert response.settings["log_warning"].bool_param is False
        assert client.get_log_settings().settings["log_verbose_level"].uint32_param == 3
    finally:
        restored = client.update_log_settings({"log_verbose_level": 0, "log_warning": True})
    assert restored.settings["log_verbose_level"].uint32_param == 0 and restored.settings["log_warning"].bool_param


def _trace(response: pb.TraceSettingResponse) -> dict[str, list[str]]:
    return {key: list(value.value) for key, value in response.settings.items()}


def test_trace_settings_are_global_with_per_model_overrides(client: grpcclient.InferenceServerClient) -> None:
    assert _trace(client.get_trace_settings()) == TRACE_DEFAULTS
    try:
        assert _trace(client.update_trace_settings("simple", {"trace_rate": "5"})) == {
            **TRACE_DEFAULTS,
            "trace_rate": ["5"],
        }
        assert _trace(client.get_trace_settings()) == TRACE_DEFAULTS
        client.update_trace_settings(settings={"trace_count": "10", "log_frequency": "3"})
        assert _trace(client.get_trace_settings("simple")) == {
            **TRACE_DEFAULTS,
            "trace_rate": ["5"],
            "trace_count": ["10"],
            "log_frequency": ["3"],
        }
        assert _trace(client.update_trace_settings("simple", {"trace_rate": None}))["trace_rate"] == ["1000"]
        with pytest.raises(InferenceServerException) as excinfo:
            client.update_trace_settings(settings={"trace_count": "-5"})
        assert _status(excinfo) == "StatusCode.INVALID_ARGUMENT" and "trace_count" in excinfo.value.message()
        with pytest.raises(InferenceServerException) as excinfo:
            client.get_trace_settings("no_such_model")
        assert "no_such_model" in excinfo.value.message()
    finally:
        client.update_trace_settings(settings={"trace_count": None, "log_frequency": None})
        client.update_trace_settings("simple", {"trace_rate": None})
    assert _trace(client.get_trace_settings()) == TRACE_DEFAULTS


# -- streaming -------------------------------------------------------------------------------------------
def test_model_stream_infer_answers_every_request_with_its_id(server: RunningServer) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for i in range(5):
                client.async_stream_infer("simple", _simple_inputs(a, np.full_like(a, i)), request_id=f"s{i}")
            bad = [grpcclient.InferInput("INPUTX", [1, 16], "INT32")] + _simple_inputs(a, a)[1:]
            bad[0].set_data_from_numpy(a)
            client.async_stream_infer("simple", bad, request_id="bad")
            client.async_stream_infer("no_such_model", _simple_inputs(a, a), request_id="lost")
            results: dict[str, Any] = {}
            errors: list[str] = []
            for _ in range(7):
                result, error = answers.get(timeout=30)
                if error is not None:
                    errors.append(error.message())
                else:
                    results[result.get_response().id] = result
        finally:
            client.stop_stream()
    assert sorted(results) == [f"s{i}" for i in range(5)]
    for i in range(5):
        np.testing.assert_array_equal(results[f"s{i}"].as_numpy("OUTPUT0"), a + i)
    assert sorted(errors) == sorted(
        [
            "Request for unknown model: 'no_such_model' is not found",
            "unexpected inference input 'INPUTX' for model 'simple'",
        ]
    )


def test_aio_stream_infer_yields_a_response_per_request(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(4):
            yield {"model_name": "simple", "inputs": _simple_inputs(a, np.full_like(a, i)), "request_id": f"a{i}"}

    async def scenario() -> dict[str, np.ndarray]:
        seen: dict[str, np.ndarray] = {}
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                seen[result.get_response().id] = result.as_numpy("OUTPUT1")
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(seen) == ["a0", "a1", "a2", "a3"]
    for i in range(4):
        np.testing.assert_array_equal(seen[f"a{i}"], a - i)


# -- the aio client ---------------------------------------------------------------------------------------
def test_aio_client_reads_health_metadata_config_statistics_and_settings(server: RunningServer) -> None:
    async def scenario() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple")
            assert not await client.is_model_ready("no_such_model")
            assert TRITON_EXTENSIONS <= set((await client.get_server_metadata()).extensions)
            assert list((await client.get_model_metadata("simple")).inputs[0].shape) == [-1, 16]
            assert (await client.get_model_config("simple")).config.max_batch_size == 8
            assert (await client.get_inference_statistics("simple")).model_stats[0].name == "simple"
            assert (await client.get_log_settings()).settings["log_info"].bool_param in (True, False)
            assert list((await client.get_trace_settings()).settings["trace_mode"].value) == ["triton"]
            with pytest.raises(InferenceServerException) as excinfo:
                await client.get_model_metadata("no_such_model")
            assert _status(excinfo) == "StatusCode.NOT_FOUND"

    asyncio.run(scenario())


def test_aio_client_infers_every_datatype_and_uses_shared_memory(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    key = f"/nereid_grpc_aio_{os.getpid()}"
    handle = shm.create_shared_memory_region("grpc_aio", key, 192)

    async def scenario() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            for datatype in DTYPES:
                data = sample(datatype)
                received = (await client.infer(echo_model(datatype), [_echo_input(datatype, data)])).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(received, data, err_msg=datatype)
            result = await client.infer(
                "simple",
                _simple_inputs(a, a),
                outputs=[grpcaio.InferRequestedOutput("OUTPUT0", class_count=1)],
                request_id="aio-9",
                parameters={"custom": "value"},
            )
            assert result.get_response().id == "aio-9"
            assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == [b"30:15:label_15"]

            await client.register_system_shared_memory("grpc_aio", key, 192)
            try:
                assert set((await client.get_system_shared_memory_status()).regions) == {"grpc_aio"}
                inputs = [grpcaio.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_shared_memory("grpc_aio", 64)
                output = grpcaio.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory("grpc_aio", 64, offset=128)
                await client.infer("simple", inputs, outputs=[output])
                with pytest.raises(InferenceServerException) as excinfo:
                    await client.register_cuda_shared_memory("cuda_region", b"\0" * 64, 0, 64)
                assert _status(excinfo) == "StatusCode.UNIMPLEMENTED"
            finally:
                await client.unregister_system_shared_memory("grpc_aio")
            assert len((await client.get_system_shared_memory_status()).regions) == 0

    try:
        shm.set_shared_memory_region(handle, [a])
        asyncio.run(scenario())
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128), a + a)
    finally:
        shm.destroy_shared_memory_region(handle)
