"""BLS calls that carry the caller's trace (`trace=request.trace()`), as Triton's docs show: MODE picks exec,
async_exec, a decoupled stream, a nested call (this model calling itself) or a call without the trace."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def _add_sub(a, b, trace):
    inputs = [pb_utils.Tensor("INPUT0", a.reshape(1, 4)), pb_utils.Tensor("INPUT1", b.reshape(1, 4))]
    kwargs = {"trace": trace} if trace is not None else {}
    return pb_utils.InferenceRequest(
        model_name="add_sub_python", requested_output_names=["OUTPUT0"], inputs=inputs, **kwargs
    )


def _output(response, name, shape):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy().reshape(shape)


def _call(mode, a, b, trace):
    if mode == "exec":
        return _output(_add_sub(a, b, trace).exec(), "OUTPUT0", 4)
    if mode == "untraced":
        return _output(_add_sub(a, b, None).exec(), "OUTPUT0", 4)
    if mode == "async_exec":

        async def call():
            return await _add_sub(a, b, trace).async_exec()

        return _output(asyncio.run(call()), "OUTPUT0", 4)
    if mode == "stream":
        request = pb_utils.InferenceRequest(
            model_name="count_up", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("N", np.array([3], dtype=np.int32))], trace=trace,
        )
        counts = [int(_output(r, "OUT", 1)[0]) for r in request.exec(decoupled=True) if r.output_tensors()]
        return np.array(counts + [0] * (4 - len(counts)), dtype=np.float32)
    if mode == "nested":
        inputs = [pb_utils.Tensor("MODE", np.array([b"exec"], dtype=np.object_)), pb_utils.Tensor("INPUT0", a),
                  pb_utils.Tensor("INPUT1", b)]
        request = pb_utils.InferenceRequest(
            model_name="bls_traced", requested_output_names=["OUTPUT0"], inputs=inputs, trace=trace
        )
        return _output(request.exec(), "OUTPUT0", 4)
    raise pb_utils.TritonModelException(f"unknown MODE {mode!r}")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            trace = request.trace()
            context = trace.get_context() or ""
            try:
                output = _call(mode, a, b, trace)
            except pb_utils.TritonModelException as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", output.astype(np.float32)),
                pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=np.object_)),
            ]))
        return responses
