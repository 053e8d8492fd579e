"""grpc.aio calls on pre-serialized ModelInferRequests: unary `ModelInfer` and bidirectional `ModelStreamInfer`
with raw bytes in and out (no per-request protobuf encoding). Stream responses are decoded only as far as
needed: an error check, and for decoupled models the final-response flag."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

__all__ = ["StreamReply", "decode_stream_reply", "open_channels", "stream_method", "unary_method"]

_SERVICE = "/inference.GRPCInferenceService/"


def open_channels(target: str, count: int) -> list[grpc.aio.Channel]:
    """`count` channels with their own TCP connections (a local subchannel pool), so load spreads over them."""
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
    ]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(max(1, count))]


def unary_method(channel: grpc.aio.Channel) -> Any:
    # No serializers: requests go out as the bytes given and replies come back as bytes.
    return channel.unary_unary(_SERVICE + "ModelInfer")


def stream_method(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(_SERVICE + "ModelStreamInfer")


class StreamReply:
    __slots__ = ("error", "final", "has_outputs", "request_id")

    def __init__(self, error: str, final: bool, has_outputs: bool, request_id: str) -> None:
        self.error = error
        self.final = final
        self.has_outputs = has_outputs
        self.request_id = request_id


_pb: Any = None


def decode_stream_reply(data: bytes, decoupled: bool) -> StreamReply:
    """Decode one ModelStreamInferResponse. For an ordinary model every reply is final."""
    global _pb
    if _pb is None:
        from tritonclient.grpc import service_pb2

        _pb = service_pb2
    message = _pb.ModelStreamInferResponse.FromString(data)
    response = message.infer_response
    if message.error_message:
        return StreamReply(message.error_message, True, False, response.id)
    has_outputs = len(response.outputs) > 0 or len(response.raw_output_contents) > 0
    if not decoupled:
        return StreamReply("", True, has_outputs, response.id)
    final = "triton_final_response" in response.parameters and response.parameters["triton_final_response"].bool_param
    return StreamReply("", bool(final), has_outputs, response.id)
