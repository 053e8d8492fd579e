"""Encode a run's inputs once into wire templates: HTTP JSON or binary-extension bodies, or serialized gRPC
ModelInferRequests, with tensors inline or as shared-memory references."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from nereid.tools.perf.config import PerfConfig
from nereid.tools.perf.control_client import ModelInfo, split_url
from nereid.tools.perf.input_data import InputSet, Sample
from nereid.tools.perf.shared_memory import SystemSharedMemory
from nereid.tools.perf.wire import GrpcTemplate, HttpTarget, HttpTemplate

__all__ = ["encode_grpc", "encode_http", "http_target"]


def http_target(model: ModelInfo, config: PerfConfig) -> HttpTarget:
    host, port = split_url(config.server_url, 8000)
    path = f"/v2/models/{quote(model.name, safe='')}"
    if model.version:
        path += f"/versions/{quote(model.version, safe='')}"
    extra = b"".join(f"{k}: {v}\r\n".encode() for k, v in config.headers.items())
    host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return HttpTarget(
        host=host,
        port=port,
        path=(path + "/infer").encode(),
        host_header=host_header.encode(),
        extra_headers=extra,
        binary_format=config.input_tensor_format == "binary" and config.shared_memory == "none",
    )


def _http_template(model: ModelInfo, sample: Sample, config: PerfConfig, shm: SystemSharedMemory | None, where: tuple[int, int]) -> HttpTemplate:
    inputs: list[dict[str, Any]] = []
    binary: list[bytes] = []
    for tensor in sample:
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if shm is not None:
            item["parameters"] = shm.inputs[where[0]][where[1]][tensor.name].parameters()
        elif config.input_tensor_format == "binary":
            item["parameters"] = {"binary_data_size": len(tensor.raw)}
            binary.append(tensor.raw)
        else:
            item["data"] = tensor.values
        inputs.append(item)
    header: dict[str, Any] = {"inputs": inputs}
    if shm is not None:
        header["outputs"] = [{"name": name, "parameters": placement.parameters()} for name, placement in shm.outputs.items()]
    elif config.output_tensor_format == "binary":
        header["outputs"] = [{"name": spec.name, "parameters": {"binary_data": True}} for spec in model.outputs]
    encoded = orjson.dumps(header)
    return HttpTemplate(header_tail=encoded[1:], binary=b"".join(binary))


def encode_http(model: ModelInfo, inputs: InputSet, config: PerfConfig, shm: SystemSharedMemory | None) -> list[list[HttpTemplate]]:
    return [
        [_http_template(model, sample, config, shm, (s, i)) for i, sample in enumerate(stream)]
        for s, stream in enumerate(inputs.streams)
    ]


def encode_grpc(
    model: ModelInfo, inputs: InputSet, config: PerfConfig, shm: SystemSharedMemory | None, parameters: dict[str, Any]
) -> list[list[GrpcTemplate]]:
    from tritonclient.grpc import service_pb2 as pb

    def set_parameter(target: Any, key: str, value: Any) -> None:
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = str(value)

    streams = []
    for s, stream in enumerate(inputs.streams):
        encoded = []
        for i, sample in enumerate(stream):
            request = pb.ModelInferRequest(model_name=model.name, model_version=model.version)
            for key, value in parameters.items():
                set_parameter(request.parameters, key, value)
            for tensor in sample:
                item = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
                if shm is not None:
                    for key, value in shm.inputs[s][i][tensor.name].parameters().items():
                        set_parameter(item.parameters, key, value)
                else:
                    request.raw_input_contents.append(tensor.raw)
            if shm is not None:
                for name, placement in shm.outputs.items():
                    output = request.outputs.add(name=name)
                    for key, value in placement.parameters().items():
                        set_parameter(output.parameters, key, value)
            encoded.append(GrpcTemplate(request.SerializeToString()))
        streams.append(encoded)
    return streams
