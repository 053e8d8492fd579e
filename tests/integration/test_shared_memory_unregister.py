"""A shared-memory region unregistered while a request uses it stays registered (listed, readable and writable) until
the request ends, as Triton keeps it (qa/L0_shared_memory's TestSharedMemoryUnregister)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.servers import RunningServer, start_nereid

_SLOW_DOUBLE = '''
import json
import pathlib
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.started = pathlib.Path(json.loads(args["model_config"])["parameters"]["started"]["string_value"])

    def execute(self, requests):
        self.started.touch()  # tells the test that a request is running
        time.sleep(1.5)  # long enough for the test to unregister the regions while this request runs
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
                for r in requests]
'''


_STARTED = "started"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = tmp_path_factory.mktemp("repository") / "slow_double"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_SLOW_DOUBLE)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        f'parameters {{ key: "started" value {{ string_value: "{model / _STARTED}" }} }}\n'
    )
    running = start_nereid(model.parent, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    running.extra["started"] = str(model / _STARTED)
    yield running
    assert running.stop() == 0, running.log()


def _listed(server: RunningServer) -> list[str]:
    with httpclient.InferenceServerClient(server.http_url) as other:
        return sorted(region["name"] for region in other.get_system_shared_memory_status())


def test_regions_unregistered_during_inference_stay_until_their_requests_end(server: RunningServer) -> None:
    key_in, key_out = f"/nereid_unreg_in_{os.getpid()}", f"/nereid_unreg_out_{os.getpid()}"
    handle_in = shm.create_shared_memory_region("in", key_in, 16)
    handle_out = shm.create_shared_memory_region("out", key_out, 16)
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    try:
        shm.set_shared_memory_region(handle_in, [np.arange(4, dtype=np.int32)])
        client.register_system_shared_memory("in", key_in, 16)
        client.register_system_shared_memory("out", key_out, 16)
        tensor = httpclient.InferInput("IN", [4], "INT32")
        tensor.set_shared_memory("in", 16)
        output = httpclient.InferRequestedOutput("OUT", binary_data=True)
        output.set_shared_memory("out", 16)
        first = client.async_infer("slow_double", [tensor], outputs=[output])
        started = Path(server.extra["started"])
        deadline = time.monotonic() + 30
        while not started.exists():  # the model is running the request
            assert time.monotonic() < deadline, "the model never started the request"
            time.sleep(0.01)
        with httpclient.InferenceServerClient(server.http_url) as other:
            other.unregister_system_shared_memory()  # accepted at once
        assert _listed(server) == ["in", "out"]
        second = client.async_infer("slow_double", [tensor], outputs=[output])  # still usable while pending
        first.get_result()
        assert _listed(server) == ["in", "out"]  # the second request still uses them
        second.get_result()
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.int32, [4]), np.arange(4) * 2)
        assert _listed(server) == []
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)
        for key in (key_in, key_out):
            Path("/dev/shm", key.lstrip("/")).unlink(missing_ok=True)
