"""Models the tracing tests write into temporary repositories."""

from __future__ import annotations

# An ensemble of two steps of the example add_sub_python: SUM_OF_BOTH = (A + B) + (A - B), so each request has two
# child traces, the second fed by the first.
TWICE_ENSEMBLE = """
name: "add_sub_twice"
platform: "ensemble"
max_batch_size: 64
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "SUM_OF_BOTH" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add_sub_python" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "difference" } },
    { model_name: "add_sub_python" model_version: -1
      input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "difference" }
      output_map { key: "OUTPUT0" value: "SUM_OF_BOTH" } }
  ]
}
"""
