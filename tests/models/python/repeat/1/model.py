"""Decoupled: for each element of IN, a response with OUT = the element, IDX = its index and DATA = DATA_SIZE
floats of the element; then a bare TRITONSERVER_RESPONSE_COMPLETE_FINAL. With THREADED, the responses come from a
thread after execute() has returned, reading the request's own input array then (as Triton's decoupled examples do:
the request's inputs stay valid until its final flag); with AFTER_NEXT too, only once the next execute() has begun. A negative element sends an error response in its place; 666 ends the
worker process (os._exit) in the middle of the stream."""

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.waiting = []  # events of threads that start once the next execute() has begun

    def execute(self, requests):
        for began in self.waiting:
            began.set()
        self.waiting = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            size_tensor = pb_utils.get_input_tensor_by_name(request, "DATA_SIZE")
            size = int(size_tensor.as_numpy()[0]) if size_tensor is not None else 1
            threaded = pb_utils.get_input_tensor_by_name(request, "THREADED")
            sender = request.get_response_sender()
            if threaded is not None and bool(threaded.as_numpy()[0]):
                began = threading.Event()
                after_next = pb_utils.get_input_tensor_by_name(request, "AFTER_NEXT")
                if after_next is not None and bool(after_next.as_numpy()[0]):
                    self.waiting.append(began)
                else:
                    began.set()
                thread = threading.Thread(target=self.stream_later, args=(began, sender, values, size))
                thread.start()
                self.threads.append(thread)
            else:
                self.stream(sender, values, size)
        return None

    def stream_later(self, began, sender, values, size):
        began.wait(30)
        self.stream(sender, values, size)

    def stream(self, sender, values, size):
        for index, value in enumerate(values.tolist()):
            if value == 666:
                os._exit(5)
            if value < 0:
                error = pb_utils.TritonError(f"negative element {value}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                pb_utils.Tensor("DATA", np.full(size, value, np.float32)),
            ]
            sender.send(pb_utils.InferenceResponse(outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
