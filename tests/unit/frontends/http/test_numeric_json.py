"""Large JSON /infer bodies take simdjson's path (numbers read straight into numpy), and every body decodes to the
same request, or is refused with the same words, as on the orjson path it replaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from nereid.core.errors import NereidError
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.types import InferenceRequest
from nereid.frontends.http import codec
from nereid.frontends.http.numeric_json import LARGE_BODY_BYTES, loads_numeric

COUNT = 16384  # elements per tensor: every body below is past LARGE_BODY_BYTES


def _body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    body = orjson.dumps({"id": "r", "inputs": list(inputs), **extra})
    assert len(body) >= LARGE_BODY_BYTES
    return body


def _tensor(name: str, datatype: str, data: Any, shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape or [COUNT], "data": data}


def _both(body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[], InferenceRequest], Callable[[], InferenceRequest]]:
    """Decoders of `body`: this path's and the orjson path's (the fast path switched off)."""

    def fast() -> InferenceRequest:
        return codec.decode_request(body, None, "m", "", SharedMemoryRegistry())

    def plain() -> InferenceRequest:
        with monkeypatch.context() as patch:
            patch.setattr(codec, "loads_numeric", lambda _body: None)
            return codec.decode_request(body, None, "m", "", SharedMemoryRegistry())

    return fast, plain


NUMERIC = ["FP16", "BF16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


@pytest.mark.parametrize("datatype", NUMERIC)
def test_each_numeric_type_decodes_to_the_same_tensor_as_on_the_orjson_path(datatype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    if datatype.startswith(("FP", "BF")):
        data: list[Any] = (rng.standard_normal(COUNT) * 1e3).tolist()
        data[:3] = [0, -7, 3]  # JSON integers among the floats
    else:
        low, high = (0, 100) if datatype.startswith("UINT") else (-100, 100)
        data = rng.integers(low, high, COUNT).tolist()
        data[0] = int(np.iinfo(np.dtype(datatype.lower())).max)
    body = _body(_tensor("X", datatype, data, [COUNT // 4, 4]), outputs=[{"name": "Y", "parameters": {"binary_data": True}}])
    doc = loads_numeric(body)
    assert doc is not None and isinstance(doc["inputs"][0]["data"], np.ndarray)  # the path is taken
    fast, plain = _both(body, monkeypatch)
    got, want = fast(), plain()
    assert got.inputs[0].data.dtype == want.inputs[0].data.dtype and got.inputs[0].shape == (COUNT // 4, 4)
    np.testing.assert_array_equal(got.inputs[0].data, want.inputs[0].data)
    assert got.id == want.id and [o.name for o in got.outputs] == ["Y"] and got.outputs[0].parameters == {"binary_data": True}


def test_nested_data_is_flattened_and_bytes_and_bool_inputs_keep_their_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    nested = np.arange(COUNT, dtype=np.float32).reshape(COUNT // 8, 8)
    words = [f"w{i}" for i in range(64)]
    flags = [True, False] * 32
    body = _body(_tensor("X", "FP32", nested.tolist(), [COUNT // 8, 8]), _tensor("W", "BYTES", words, [64]),
                 _tensor("B", "BOOL", flags, [64]), parameters={"priority": 2})  # fmt: skip
    fast, plain = _both(body, monkeypatch)
    got, want = fast(), plain()
    np.testing.assert_array_equal(got.inputs[0].data, nested)
    assert got.inputs[1].data.tolist() == want.inputs[1].data.tolist() == [w.encode() for w in words]
    np.testing.assert_array_equal(got.inputs[2].data, np.array(flags))
    assert got.priority == want.priority == 2


def _refusal(decode: Callable[[], InferenceRequest]) -> str:
    with pytest.raises(NereidError) as caught:
        decode()
    return str(caught.value)


def _outcome(decode: Callable[[], InferenceRequest]) -> Any:
    try:
        return repr(decode().inputs[0].data.tolist())  # repr: NaN equals NaN
    except NereidError as exc:
        return str(exc)


@pytest.mark.parametrize(
    "datatype, bad",
    [("INT8", 300), ("UINT8", -1), ("UINT64", -1), ("INT32", 1.5), ("FP32", True), ("FP32", None), ("FP32", "1.0")],
)
def test_a_value_off_the_fast_path_gets_the_orjson_paths_outcome(datatype: str, bad: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    data: list[Any] = [1] * COUNT
    data[COUNT // 2] = bad
    body = _body(_tensor("X", datatype, data))
    assert loads_numeric(body) is None
    fast, plain = _both(body, monkeypatch)
    assert _outcome(fast) == _outcome(plain)
    if datatype.startswith(("INT", "UINT")) and isinstance(bad, int):  # out of the type's range: refused, named
        assert "'X'" in _outcome(fast) and "'m'" in _outcome(fast)


def test_bodies_simdjson_reads_another_way_are_left_to_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    floats = ",".join(["1.5"] * COUNT)
    # NaN literals (Triton's), an integer past 64 bits (a double for orjson), and a wrong element count.
    for text, expect in [
        (floats.replace("1.5", "NaN", 1), "nan"),
        (floats.replace("1.5", "123456789012345678901234567890", 1), 1.2345678901234568e29),
    ]:
        body = b'{"inputs":[{"name":"X","datatype":"FP64","shape":[%d],"data":[%s]}]}' % (COUNT, text.encode())
        assert loads_numeric(body) is None
        first = codec.decode_request(body, None, "m", "", SharedMemoryRegistry()).inputs[0].data[0]
        assert np.isnan(first) if expect == "nan" else first == expect
    fast, plain = _both(_body(_tensor("X", "FP32", [1.0] * (COUNT - 1))), monkeypatch)
    assert _refusal(fast) == _refusal(plain) and f"needs {COUNT} elements, got {COUNT - 1}" in _refusal(fast)


def test_a_large_body_that_is_not_json_gets_the_parse_error(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _body(_tensor("X", "FP32", [1.0] * COUNT))
    for broken in (body[:-1], body.replace(b'"r"', b'"\xff"'), body + b"x"):
        fast, plain = _both(broken, monkeypatch)
        assert _refusal(fast) == _refusal(plain) and "failed to parse the request JSON buffer" in _refusal(fast)


def test_small_bodies_stay_on_the_orjson_path() -> None:
    assert loads_numeric(orjson.dumps({"inputs": [_tensor("X", "FP32", [1.0] * 16, [16])]})) is None


def test_a_key_holding_a_nul_character_leaves_the_body_to_orjson() -> None:
    # simdjson lists such a key but cannot look it up again; schemathesis found it as a 500 from /infer
    body = ('{"inputs":[{"a\\u0000b":"x","data":[' + ",".join(["1"] * 3000) + "]}]}").encode()
    assert loads_numeric(body) is None
