"""Custom metrics: a counter of requests, a gauge of the last VALUE, a histogram of VALUEs. COUNT is the counter
read back with value()."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        requests = pb_utils.MetricFamily(
            name="custom_requests_seen", description="Requests this model saw", kind=pb_utils.MetricFamily.COUNTER
        )
        last = pb_utils.MetricFamily(name="custom_last_value", description="The last VALUE", kind=pb_utils.MetricFamily.GAUGE)
        values = pb_utils.MetricFamily(
            name="custom_value_histogram", description="VALUEs seen", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.families = (requests, last, values)  # Triton deletes a family (and its metrics) with its last reference
        self.requests = requests.Metric(labels=labels)
        self.last = last.Metric(labels=labels)
        self.values = values.Metric(labels=labels, buckets=[1.0, 2.0, 5.0])
        self.last.set(-1.0)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(value)
            self.values.observe(value)
            count = np.array([self.requests.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", count)]))
        return responses
