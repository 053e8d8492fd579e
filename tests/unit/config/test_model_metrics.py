"""config.pbtxt's model_metrics (later Triton's per-model histogram buckets): parsing, the JSON view, validation,
and the first-response histogram's buckets in the model statistics."""

from __future__ import annotations

import json
import logging

import pytest

from nereid.config.model_config import (
    config_from_json,
    config_to_json_dict,
    mc,
    normalize,
    parse_json,
    parse_pbtxt,
    validate,
)
from nereid.config.model_metrics import FIRST_RESPONSE_HISTOGRAM, histogram_buckets
from nereid.core.errors import NereidError, Status
from nereid.core.statistics import FIRST_RESPONSE_BUCKETS_MS, ModelStatistics

BASE = """
name: "m"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
BUCKETS = """
model_metrics {
  metric_control [
    { metric_identifier { family: "nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 2, 4, 8 ] } }
  ]
}
"""


def _loaded(text: str) -> mc.ModelConfig:
    config = parse_pbtxt(text, "m/config.pbtxt")
    normalize(config, "m")
    validate(config, "m")
    return config


def test_model_metrics_in_config_pbtxt_parse_into_the_histogram_buckets() -> None:
    config = _loaded(BASE + BUCKETS)
    assert isinstance(config, mc.ModelConfig)  # the rest of the server keeps tritonclient's ModelConfig
    assert config.model_transaction_policy.decoupled
    assert histogram_buckets(config, FIRST_RESPONSE_HISTOGRAM) == (1.0, 2.0, 4.0, 8.0)
    copy = mc.ModelConfig()
    copy.CopyFrom(config)  # the repository copies configs; model_metrics must survive it
    assert histogram_buckets(copy, FIRST_RESPONSE_HISTOGRAM) == (1.0, 2.0, 4.0, 8.0)


def test_a_config_without_model_metrics_keeps_the_default_buckets() -> None:
    config = _loaded(BASE)
    assert histogram_buckets(config, FIRST_RESPONSE_HISTOGRAM) is None
    assert "model_metrics" not in config_to_json_dict(config)


def test_the_config_json_shows_model_metrics_and_parses_back() -> None:
    shown = config_to_json_dict(_loaded(BASE + BUCKETS))
    assert shown["model_metrics"] == {
        "metric_control": [
            {"metric_identifier": {"family": FIRST_RESPONSE_HISTOGRAM}, "histogram_options": {"buckets": [1, 2, 4, 8]}}
        ]
    }
    # As a load request's config override (and a Python model's auto-completed config) carries it back.
    again = config_from_json(json.dumps(shown), "m")
    assert histogram_buckets(again, FIRST_RESPONSE_HISTOGRAM) == (1.0, 2.0, 4.0, 8.0)
    camel = parse_json(json.dumps({"modelMetrics": {"metricControl": [
        {"metricIdentifier": {"family": FIRST_RESPONSE_HISTOGRAM}, "histogramOptions": {"buckets": [3]}}
    ]}}))
    assert histogram_buckets(camel, FIRST_RESPONSE_HISTOGRAM) == (3.0,)


def test_an_unknown_field_inside_model_metrics_is_a_parse_error() -> None:
    with pytest.raises(NereidError) as failure:
        parse_pbtxt(BASE + 'model_metrics { metric_control [ { bucket: [ 1 ] } ] }', "m/config.pbtxt")
    assert failure.value.status is Status.INVALID_ARG
    assert 'Message type "inference.ModelMetrics.MetricControl" has no field named "bucket"' in str(failure.value)


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ('histogram_options { buckets: [ 1 ] }', "metric control must specify 'metric_identifier'"),
        ('metric_identifier { } histogram_options { buckets: [ 1 ] }', "metric identifier must specify non-empty 'family'"),
        (f'metric_identifier {{ family: "{FIRST_RESPONSE_HISTOGRAM}" }}', "metric control must specify 'histogram_options'"),
        (
            f'metric_identifier {{ family: "{FIRST_RESPONSE_HISTOGRAM}" }} histogram_options {{ }}',
            "histogram options must specify non-empty 'buckets'",
        ),
        (
            f'metric_identifier {{ family: "{FIRST_RESPONSE_HISTOGRAM}" }} histogram_options {{ buckets: [ 4, 2 ] }}',
            f"histogram 'buckets' of '{FIRST_RESPONSE_HISTOGRAM}': Bucket Boundaries must be finite and strictly sorted, got [4, 2]",
        ),
        (
            f'metric_identifier {{ family: "{FIRST_RESPONSE_HISTOGRAM}" }} histogram_options {{ buckets: [ 1, 1 ] }}',
            "Bucket Boundaries must be finite and strictly sorted, got [1, 1]",
        ),
    ],
)
def test_bad_model_metrics_fail_the_load_with_triton_wording(control: str, message: str) -> None:
    with pytest.raises(NereidError) as failure:
        _loaded(BASE + f"model_metrics {{ metric_control [ {{ {control} }} ] }}")
    assert failure.value.status is Status.INVALID_ARG
    assert str(failure.value).startswith("model 'm': ")
    assert message in str(failure.value)


def test_a_family_that_is_not_customizable_is_warned_about_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    text = BASE + 'model_metrics { metric_control [ { metric_identifier { family: "nv_inference_count" } histogram_options { buckets: [ 1 ] } } ] }'
    with caplog.at_level(logging.WARNING):
        config = _loaded(text)
    assert "Metric family 'nv_inference_count' in 'metric_identifier' is not a customizable metric in Triton core" in caplog.text
    assert histogram_buckets(config, FIRST_RESPONSE_HISTOGRAM) is None


def test_first_responses_are_counted_in_the_models_buckets() -> None:
    stats = ModelStatistics("m", "1")
    stats.enable_first_response_histogram((1.0, 2.0, 4.0, 8.0))
    for ms in (0.5, 1.0, 3.0, 8.0, 9.0, 100.0):
        stats.record_first_response(int(ms * 1e6))
    assert stats.first_response == [2, 0, 1, 1, 2]  # le 1, 2, 4, 8, +Inf (not yet cumulative)
    default = ModelStatistics("d", "1")
    default.enable_first_response_histogram(None)
    assert default.first_response_buckets == FIRST_RESPONSE_BUCKETS_MS


def test_the_grpc_config_reply_carries_model_metrics_on_the_wire() -> None:
    """tritonclient's protobuf lacks the field, but a client built on later Triton's proto reads it from field 26."""
    from tritonclient.grpc import service_pb2

    reply = service_pb2.ModelConfigResponse(config=_loaded(BASE + BUCKETS))
    received = service_pb2.ModelConfigResponse()
    received.ParseFromString(reply.SerializeToString())
    assert histogram_buckets(received.config, FIRST_RESPONSE_HISTOGRAM) == (1.0, 2.0, 4.0, 8.0)
