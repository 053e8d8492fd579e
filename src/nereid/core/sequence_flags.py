"""The bits of `InferenceRequest.flags`, Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END, defined once
for the frontends, the sequence batcher and pb_utils. It imports nothing, so a model's worker process pays nothing."""

__all__ = ["SEQUENCE_END", "SEQUENCE_START"]

SEQUENCE_START = 1
SEQUENCE_END = 2
