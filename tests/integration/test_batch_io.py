"""Ragged batching through a real Nereid with the official tritonclient: an ONNX model receives its ragged input
flat and every batch-input kind as graph inputs, echoes them, and its batch output is scattered back by each
request's input shape (Triton's ORT backend behaviour, which real Triton here cannot run)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.integration.onnx_builders import save_model, write
from tests.servers import RunningServer, start_nereid

# (batch input kind, target, config type, ONNX type, echo output)
_KINDS = [
    ("BATCH_ELEMENT_COUNT", "EC", "TYPE_FP32", TensorProto.FLOAT, "EC_OUT"),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", "ACC", "TYPE_INT32", TensorProto.INT32, "ACC_OUT"),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ACC0", "TYPE_INT32", TensorProto.INT32, "ACC0_OUT"),
    ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "MAXSHAPE", "TYPE_INT32", TensorProto.INT32, None),
    ("BATCH_ITEM_SHAPE", "SHAPE", "TYPE_INT32", TensorProto.INT32, "SHAPE_OUT"),
    ("BATCH_ITEM_SHAPE_FLATTEN", "FLAT", "TYPE_FP32", TensorProto.FLOAT, "FLAT_OUT"),
]


def _ragged_model(path: Path) -> None:
    """INPUT FP32 [-1] (the whole batch, flat) and the six batch inputs -> OUT = 2 * INPUT, each batch input
    echoed, and MAX_OUT: MAXSHAPE's length repeated once per request."""
    inputs = [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["n"])]
    outputs = [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["n"])]
    nodes = [
        helper.make_node("Constant", [], ["TWO"], value=helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])),
        helper.make_node("Mul", ["INPUT", "TWO"], ["OUT"]),
    ]
    for _, target, _, onnx_type, echo in _KINDS:
        shape: list[Any] = [f"{target}_rows", 1] if target == "SHAPE" else [f"{target}_rows"]
        inputs.append(helper.make_tensor_value_info(target, onnx_type, shape))
        if echo is not None:
            nodes.append(helper.make_node("Identity", [target], [echo]))
            outputs.append(helper.make_tensor_value_info(echo, onnx_type, shape))
    nodes += [
        helper.make_node("Shape", ["MAXSHAPE"], ["MAX_LEN"]),
        helper.make_node("Shape", ["EC"], ["REQUESTS"]),
        helper.make_node("Expand", ["MAX_LEN", "REQUESTS"], ["MAX_OUT"]),
    ]
    outputs.append(helper.make_tensor_value_info("MAX_OUT", TensorProto.INT64, ["requests"]))
    save_model(helper.make_graph(nodes, "ragged", inputs, outputs), path)


_SCALAR = "dims: [1] reshape { shape: [] }"
_CONFIG = (
    'backend: "onnxruntime"\nmax_batch_size: 8\n'
    "dynamic_batching { preferred_batch_size: [3] max_queue_delay_microseconds: 20000000 }\n"
    'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true } ]\n'
    "batch_input [\n"
    + ",\n".join(
        f'  {{ kind: {kind} target_name: "{target}" data_type: {dtype} source_input: "INPUT" }}'
        for kind, target, dtype, _, _ in _KINDS
    )
    + "\n]\n"
    'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: "INPUT" } ]\n'
    "output [\n"
    '  { name: "OUT" data_type: TYPE_FP32 dims: [-1] },\n'
    f'  {{ name: "EC_OUT" data_type: TYPE_FP32 {_SCALAR} }},\n'
    f'  {{ name: "ACC_OUT" data_type: TYPE_INT32 {_SCALAR} }},\n'
    f'  {{ name: "ACC0_OUT" data_type: TYPE_INT32 {_SCALAR} }},\n'
    '  { name: "SHAPE_OUT" data_type: TYPE_INT32 dims: [1] },\n'
    f'  {{ name: "FLAT_OUT" data_type: TYPE_FP32 {_SCALAR} }},\n'
    f'  {{ name: "MAX_OUT" data_type: TYPE_INT64 {_SCALAR} }}\n'
    "]\n"
)


# A Python model with a ragged input and a dense one; each response lists the DENSE shapes of its execution.
_MIXED_CONFIG = (
    'backend: "python"\nmax_batch_size: 8\n'
    "dynamic_batching { preferred_batch_size: [2] max_queue_delay_microseconds: 500000 }\n"
    'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true },\n'
    '        { name: "DENSE" data_type: TYPE_FP32 dims: [-1] } ]\n'
    'output [ { name: "SHAPES" data_type: TYPE_INT64 dims: [-1] } ]\n'
)
_MIXED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        widths = [pb_utils.get_input_tensor_by_name(r, "DENSE").as_numpy().shape[1] for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SHAPES", np.array([widths], dtype=np.int64))])
                for _ in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("batch_io_repo")
    _ragged_model(root / "ragged" / "1" / "model.onnx")
    write(root / "ragged" / "config.pbtxt", _CONFIG)
    # The same model without a scheduler: one request per execution.
    _ragged_model(root / "ragged_single" / "1" / "model.onnx")
    write(root / "ragged_single" / "config.pbtxt", _CONFIG.replace(
        "dynamic_batching { preferred_batch_size: [3] max_queue_delay_microseconds: 20000000 }\n", ""
    ))
    # A ragged input the model does not take flat.
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUT"])], "not_flat",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["b", 4])],
    )
    save_model(graph, root / "ragged_not_flat" / "1" / "model.onnx")
    write(root / "ragged_not_flat" / "config.pbtxt", (
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [4] allow_ragged_batch: true } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [4] } ]\n'
    ))
    write(root / "ragged_and_dense" / "config.pbtxt", _MIXED_CONFIG)
    write(root / "ragged_and_dense" / "1" / "model.py", _MIXED_MODEL)
    running = start_nereid(root, "--exit-on-error=false", "--strict-readiness=false",
                           log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


_ECHOES = ["OUT", "EC_OUT", "ACC_OUT", "ACC0_OUT", "SHAPE_OUT", "FLAT_OUT", "MAX_OUT"]


def _inputs(module: Any, length: int) -> list[Any]:
    tensor = module.InferInput("INPUT", [1, length], "FP32")
    tensor.set_data_from_numpy(np.arange(1, length + 1, dtype=np.float32).reshape(1, length))
    return [tensor]


def _send_together(server: RunningServer, lengths: list[int], protocol: str) -> list[dict[str, np.ndarray]]:
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http_url, concurrency=len(lengths), network_timeout=120) as client:
            handles = [client.async_infer("ragged", _inputs(httpclient, n)) for n in lengths]
            results = [handle.get_result() for handle in handles]
    else:
        answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()

        def keep(index: int, result: Any, error: Any) -> None:
            answers.put((index, result, error))

        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            for index, n in enumerate(lengths):
                client.async_infer("ragged", _inputs(grpcclient, n), partial(keep, index), client_timeout=120)
            got = [answers.get(timeout=120) for _ in lengths]
        assert all(error is None for _, _, error in got), got
        results = [result for _, result, _ in sorted(got, key=lambda item: item[0])]
    return [{name: result.as_numpy(name) for name in _ECHOES} for result in results]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_ragged_batch_gets_every_batch_input_kind_and_its_output_scattered_back(
    server: RunningServer, protocol: str
) -> None:
    lengths = [3, 4, 5]
    answers = _send_together(server, lengths, protocol)
    for answer, n in zip(answers, lengths, strict=True):
        # The batch output comes back in the request's own shape, holding its own elements.
        assert answer["OUT"].shape == (1, n)
        np.testing.assert_array_equal(answer["OUT"], 2 * np.arange(1, n + 1, dtype=np.float32).reshape(1, n))
        assert answer["EC_OUT"].ravel().tolist() == [float(n)]
        assert answer["EC_OUT"].dtype == np.float32
        assert answer["SHAPE_OUT"].tolist() == [[n]]
        assert answer["FLAT_OUT"].ravel().tolist() == [float(n)]
        # The three requests ran as one batch: the longest request sets MAXSHAPE's length for all of them.
        assert answer["MAX_OUT"].ravel().tolist() == [max(lengths)]
        # Each request's accumulated count ends where its own elements end; WITH_ZERO gives where they start.
        assert answer["ACC_OUT"].dtype == np.int32
        assert int(answer["ACC_OUT"].item()) - int(answer["ACC0_OUT"].item()) == n
    ends = sorted(int(a["ACC_OUT"].item()) for a in answers)
    starts = sorted(int(a["ACC0_OUT"].item()) for a in answers)
    assert starts[0] == 0 and ends[-1] == sum(lengths) and starts[1:] == ends[:-1]


def test_a_single_ragged_request_is_fed_flat_and_scattered_back(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("ragged_single", _inputs(httpclient, 2))
        tensor = httpclient.InferInput("INPUT", [2, 3], "FP32")  # a batch of two items in one request
        tensor.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        two = client.infer("ragged_single", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[2.0, 4.0]])
    assert result.as_numpy("ACC0_OUT").ravel()[0] == 0
    assert result.as_numpy("MAX_OUT").ravel().tolist() == [2]
    np.testing.assert_array_equal(two.as_numpy("OUT"), 2 * np.arange(6, dtype=np.float32).reshape(2, 3))
    # One request, so one element count (all six elements); BATCH_ITEM_SHAPE has a row per batch item.
    assert two.as_numpy("SHAPE_OUT").tolist() == [[3], [3]]


def test_a_ragged_input_the_model_does_not_take_flat_is_refused_at_load(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        entries = [e for e in client.get_model_repository_index() if e["name"] == "ragged_not_flat"]
    assert entries and entries[0]["state"] == "UNAVAILABLE"
    assert "expects model provides input with shape [-1]  for ragged input 'INPUT'" in entries[0]["reason"]


def test_ragged_requests_share_a_batch_only_when_their_other_inputs_match(server: RunningServer) -> None:
    widths = [2, 3, 2, 3]
    with httpclient.InferenceServerClient(server.http_url, concurrency=len(widths), network_timeout=120) as client:
        handles = []
        for index, width in enumerate(widths):
            ragged = httpclient.InferInput("INPUT", [1, index + 1], "FP32")
            ragged.set_data_from_numpy(np.zeros((1, index + 1), dtype=np.float32))
            dense = httpclient.InferInput("DENSE", [1, width], "FP32")
            dense.set_data_from_numpy(np.zeros((1, width), dtype=np.float32))
            handles.append(client.async_infer("ragged_and_dense", [ragged, dense]))
        executions = [handle.get_result().as_numpy("SHAPES")[0].tolist() for handle in handles]
    for width, execution in zip(widths, executions, strict=True):
        # Never two DENSE widths in one execution (how the four split depends on arrival order).
        assert set(execution) == {width}


_TORCH_CONFIG = (
    'backend: "pytorch"\nmax_batch_size: 8\n'
    "dynamic_batching { preferred_batch_size: [3] max_queue_delay_microseconds: 20000000 }\n"
    'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true } ]\n'
    'batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS" data_type: TYPE_INT32\n'
    '                source_input: "INPUT" } ]\n'
    'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: "INPUT" } ]\n'
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [-1] },\n'
    '         { name: "STARTS" data_type: TYPE_INT32 dims: [1] } ]\n'
)


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    torch = pytest.importorskip("torch")

    class RaggedSum(torch.nn.Module):
        """OUT: each element plus the sum of its request's elements (found through OFFSETS); STARTS: where each
        request's elements start, one row per request."""

        def forward(self, INPUT: torch.Tensor, OFFSETS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: N803
            counts = (OFFSETS[1:] - OFFSETS[:-1]).long()
            owner = torch.repeat_interleave(torch.arange(counts.shape[0]), counts)
            sums = torch.zeros(counts.shape[0]).index_add(0, owner, INPUT)
            return INPUT + sums[owner], OFFSETS[:-1].reshape(-1, 1)

    root = tmp_path_factory.mktemp("batch_io_torch")
    (root / "ragged_torch" / "1").mkdir(parents=True)
    torch.jit.script(RaggedSum()).save(str(root / "ragged_torch" / "1" / "model.pt"))
    write(root / "ragged_torch" / "config.pbtxt", _TORCH_CONFIG)
    running = start_nereid(root, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def test_a_torchscript_model_gets_its_ragged_batch_flat_with_the_batch_input_as_an_argument(
    torch_server: RunningServer,
) -> None:
    lengths = [2, 3, 4]
    with httpclient.InferenceServerClient(torch_server.http_url, concurrency=3, network_timeout=120) as client:
        handles = [client.async_infer("ragged_torch", _inputs(httpclient, n)) for n in lengths]
        results = [handle.get_result() for handle in handles]
    starts = []
    for result, n in zip(results, lengths, strict=True):
        values = np.arange(1, n + 1, dtype=np.float32)
        # Its own elements, each plus their own sum: the model told the requests apart through OFFSETS.
        np.testing.assert_array_equal(result.as_numpy("OUT"), (values + values.sum()).reshape(1, n))
        starts.append(int(result.as_numpy("STARTS").item()))
    # One batch: in batch order, each request starts where the one before it ends.
    placed = sorted(zip(starts, lengths, strict=True))
    assert placed[0][0] == 0
    assert all(start == prev_start + prev_n for (prev_start, prev_n), (start, _) in zip(placed, placed[1:]))
