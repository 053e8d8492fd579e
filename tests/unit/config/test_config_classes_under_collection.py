"""Config parsing beside the cyclic collector: the message classes of model_metrics' private descriptor pool live as
long as the process, so a collection that gives up the GIL can never hand a parse a half-cleared class (a SIGSEGV in
protobuf's upb extension, seen under load/unload churn)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import orjson

from nereid.config.model_config import config_to_json_dict, parse_json, parse_pbtxt
from nereid.config.model_metrics import to_extended

# Nested messages, maps with message values (parameters, warmup inputs) and model_metrics: the types a parse makes
# classes for on first use.
RICH_CONFIG = """
name: "m" backend: "python" max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "a" value { string_value: "b" } }
sequence_batching {
  max_sequence_idle_microseconds: 5000
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "init" } } ]
  oldest { max_candidate_sequences: 4 }
}
optimization {
  execution_accelerators { cpu_execution_accelerator [ { name: "openvino" parameters { key: "k" value: "v" } } ] }
  input_pinned_memory { enable: true }
}
model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
version_policy { specific { versions: [ 1, 2 ] } }
response_cache { enable: true }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                   histogram_options { buckets: [ 1, 2 ] } } ] }
"""

# The crash pattern, as `nereid serve` tunes the interpreter: one thread parses and renders configs, another frees
# cyclic garbage that holds mmaps (whose freeing gives up the GIL) and collects. Fresh threads every second: a pair
# that has run a while tends to fall into step and stop meeting the window, so each pair starts at a random offset.
_CRASH_PATTERN = textwrap.dedent(
    """
    import faulthandler, gc, mmap, random, sys, threading, time
    faulthandler.enable()
    import orjson
    from nereid.config.model_config import config_to_json_dict, parse_json, parse_pbtxt
    text = sys.stdin.read()
    sys.setswitchinterval(0.0002)
    gc.set_threshold(50_000, 20, 100)
    end = time.monotonic() + float(sys.argv[1])

    class HoldsMapping:
        def __init__(self):
            self.me = self
            self.mapping = mmap.mmap(-1, 4096)

    while time.monotonic() < end:
        deadline = time.monotonic() + 1.0

        def parse():
            while time.monotonic() < deadline:
                parse_json(orjson.dumps(config_to_json_dict(parse_pbtxt(text, "config.pbtxt"))))

        def collect():
            time.sleep(random.random() * 0.002)
            while time.monotonic() < deadline:
                garbage = [HoldsMapping() for _ in range(300)]
                del garbage
                gc.collect()

        threads = [threading.Thread(target=parse), threading.Thread(target=collect)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    """
)


def _sub_message_classes(config: object) -> list[type]:
    rendered = config_to_json_dict(config)  # renders through the private pool's classes
    assert rendered["model_metrics"]["metric_control"][0]["histogram_options"]["buckets"] == [1.0, 2.0]
    extended = to_extended(config)
    return [
        type(extended.input[0]),
        type(extended.input[0].reshape),
        type(extended.parameters["a"]),
        type(extended.model_warmup[0].inputs["IN"]),
        type(extended.sequence_batching.state[0].initial_state),
        type(extended.model_metrics.metric_control[0].histogram_options),
    ]


def test_sub_message_classes_are_the_same_objects_before_and_after_a_collection() -> None:
    before = _sub_message_classes(parse_pbtxt(RICH_CONFIG, "config.pbtxt"))
    before_ids = [id(cls) for cls in before]
    del before
    gc.collect()
    after = _sub_message_classes(parse_pbtxt(RICH_CONFIG, "config.pbtxt"))
    assert [id(cls) for cls in after] == before_ids


def test_a_parse_leaves_no_cyclic_garbage_behind() -> None:
    gc.collect()
    parse_json(orjson.dumps(config_to_json_dict(parse_pbtxt(RICH_CONFIG, "config.pbtxt"))))
    assert gc.collect() == 0


def test_parsing_beside_a_collector_that_gives_up_the_gil_never_crashes() -> None:
    # Before the fix this pattern died of SIGSEGV in each of 16 runs of 8 s, within 1 to 5 s.
    run = subprocess.run(
        [sys.executable, "-c", _CRASH_PATTERN, "8"], input=RICH_CONFIG, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"the parse-and-collect pattern ended with {run.returncode}:\n{run.stderr[-3000:]}"
