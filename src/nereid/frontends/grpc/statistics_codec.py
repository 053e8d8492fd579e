"""The ModelStatisticsResponse message of Nereid's statistics, including `response_stats`.

The service protobuf that ships with the tritonclient Nereid depends on predates `response_stats` (field 9 of
ModelStatistics, a map<string, InferResponseStatistics>), so that field is written as protobuf wire bytes that
the message carries as an unknown field; newer clients read it like Triton's. Only statistics, never requests.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

# protobuf's own varint writer, for the field written as wire bytes (see the docstring).
from google.protobuf.internal.encoder import _VarintBytes as _varint
from tritonclient.grpc import service_pb2 as pb

from nereid.core.statistics import RESPONSE_STATS_FIELDS

__all__ = ["encode_statistics"]

_RESPONSE_STATS_FIELD = 9  # ModelStatistics.response_stats in Triton's grpc_service.proto


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _response_stats_bytes(response_stats: dict[str, dict[str, dict[str, int]]]) -> bytes:
    out = b""
    for key, entry in response_stats.items():
        value = b"".join(
            _field(number, pb.StatisticDuration(count=entry[name]["count"], ns=entry[name]["ns"]).SerializeToString())
            for number, name in enumerate(RESPONSE_STATS_FIELDS, start=1)
        )
        out += _field(_RESPONSE_STATS_FIELD, _field(1, key.encode()) + _field(2, value))
    return out


def encode_statistics(model_stats: list[dict[str, Any]]) -> Any:
    """A ModelStatisticsResponse for Server.statistics()'s list."""
    response = pb.ModelStatisticsResponse()
    for stats in model_stats:
        message = json_format.ParseDict(stats, pb.ModelStatistics(), ignore_unknown_fields=True)
        if stats.get("response_stats"):
            message.MergeFromString(_response_stats_bytes(stats["response_stats"]))
        response.model_stats.append(message)
    return response
