"""Ensembles in-process: the graph checks with Triton's messages, shape adaptation between batching and
non-batching steps, and decoupled steps streaming through an ensemble, over a fake backend (no framework)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereid.config.model_config import mc, normalize, parse_pbtxt
from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.scheduling.ensemble import _adapt
from nereid.scheduling.ensemble_graph import EnsembleGraph, check_composing_models, check_ensemble_config
from nereid.server import Server
from tests.unit.fakes.backend import cyclic_garbage, run_server, use_fake_backend, write_model


def _step(model: str, source: str, target: str) -> str:
    return f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "IN" value: "{source}" }} output_map {{ key: "OUT" value: "{target}" }} }}'


def _ensemble_text(name: str, steps: list[str], outputs: tuple[str, ...] = ("Y",), max_batch_size: int = 8, extra: str = "") -> str:
    outs = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ 4 ] }}' for o in outputs)
    return f'''name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {outs} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
{extra}
'''


def _ensemble(root: Path, name: str, steps: list[str], outputs: tuple[str, ...] = ("Y",)) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(_ensemble_text(name, steps, outputs))


@pytest.fixture()
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_backend(monkeypatch)


def _request(model: str, value: float = 1.0, outputs: Any = None) -> InferenceRequest:
    data = np.full((1, 4), value, dtype=np.float32)
    return InferenceRequest(model, "", [InputTensor("X", "FP32", (1, 4), data)], id="r1", outputs=outputs)


# -- decoupled steps ------------------------------------------------------------------------------------
def test_decoupled_step_streams_each_response_downstream(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "pre", "add", 1)
    write_model(tmp_path, "rep", "repeat", decoupled=True)
    write_model(tmp_path, "post", "add", 100)
    _ensemble(tmp_path, "stream", [_step("pre", "X", "a"), _step("rep", "a", "b"), _step("post", "b", "Y")])

    async def body(server: Server) -> tuple[list[InferenceResponse], Any, dict[str, Any]]:
        responses = [r async for r in server.infer_stream(_request("stream"))]
        with pytest.raises(NereidError) as refused:
            await server.infer(_request("stream"))
        return responses, refused.value, server.model_config_json("stream")

    responses, refused, config = run_server(body, tmp_path)
    data = [r for r in responses if not r.complete_only]
    assert [float(r.outputs[0].data[0, 0]) for r in data] == [102.0, 103.0, 104.0]
    assert all(r.error is None and r.model_name == "stream" and r.id == "r1" for r in responses)
    assert responses[-1].final and not any(r.final for r in responses[:-1])
    assert config["model_transaction_policy"] == {"decoupled": True}  # Triton marks such an ensemble decoupled
    assert refused.status is Status.UNSUPPORTED


def test_decoupled_step_with_no_responses_ends_with_a_bare_final_flag(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "rep", "repeat", decoupled=True, count=0)
    write_model(tmp_path, "post", "add", 1)
    _ensemble(tmp_path, "quiet", [_step("rep", "X", "b"), _step("post", "b", "Y")])

    async def body(server: Server) -> list[InferenceResponse]:
        return [r async for r in server.infer_stream(_request("quiet"))]

    responses = run_server(body, tmp_path)
    assert len(responses) == 1 and responses[0].final and responses[0].complete_only


def test_an_output_no_step_produced_is_left_out_with_triton_s_verbose_line(
    tmp_path: Path, fake_backend: None, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "add", "add", 1)
    write_model(tmp_path, "quiet", "silent")
    _ensemble(tmp_path, "partial", [_step("add", "X", "Y"), _step("quiet", "X", "Z")], outputs=("Y", "Z"))

    async def body(server: Server) -> InferenceResponse:
        return await server.infer(_request("partial"))

    with caplog.at_level("DEBUG", logger="nereid.scheduler"):
        response = run_server(body, tmp_path)
    assert [o.name for o in response.outputs] == ["Y"]
    assert "Composing models did not output tensor Z" in caplog.text


def test_failing_step_is_named_and_counted(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "pre", "add", 1)
    write_model(tmp_path, "broken", "fail")
    _ensemble(tmp_path, "failing", [_step("pre", "X", "a"), _step("broken", "a", "Y")])

    async def body(server: Server) -> tuple[NereidError, list[dict[str, Any]]]:
        with pytest.raises(NereidError) as failed:
            await server.infer(_request("failing"))
        return failed.value, server.statistics("failing") + server.statistics("pre")

    error, (ensemble, pre) = run_server(body, tmp_path)
    assert error.message == "in ensemble 'failing', model 'broken': it broke"
    assert error.status is Status.INTERNAL
    assert ensemble["inference_stats"]["fail"]["count"] == 1
    assert ensemble["inference_stats"]["success"]["count"] == 0
    assert pre["inference_stats"]["success"]["count"] == 1


def test_ensemble_statistics_sum_the_steps_compute_times(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "a", "add", 1)
    write_model(tmp_path, "b", "add", 2)
    _ensemble(tmp_path, "two", [_step("a", "X", "t"), _step("b", "t", "Y")])

    async def body(server: Server) -> dict[str, Any]:
        response = await server.infer(_request("two", 5.0))
        assert float(response.outputs[0].data[0, 0]) == 8.0
        return server.statistics("two")[0]

    stats = run_server(body, tmp_path)
    inference = stats["inference_stats"]
    assert (inference["compute_input"]["ns"], inference["compute_infer"]["ns"], inference["compute_output"]["ns"]) == (2, 4, 6)
    assert stats["execution_count"] == 1 and stats["inference_count"] == 1
    assert stats["batch_stats"][0]["batch_size"] == 1


def test_requested_outputs_prune_the_steps_that_feed_only_others(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "left", "add", 1)
    write_model(tmp_path, "right", "add", 2)
    _ensemble(tmp_path, "split", [_step("left", "X", "L"), _step("right", "X", "R")], outputs=("L", "R"))

    async def body(server: Server) -> tuple[list[str], int]:
        from nereid.core.types import RequestedOutput

        response = await server.infer(_request("split", outputs=[RequestedOutput("R")]))
        return [o.name for o in response.outputs], server.statistics("left")[0]["inference_stats"]["success"]["count"]

    names, left_runs = run_server(body, tmp_path)
    assert names == ["R"] and left_runs == 0


def test_tensors_pass_between_steps_without_copies(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "echo", "echo")
    _ensemble(tmp_path, "echoes", [_step("echo", "X", "a"), _step("echo", "a", "b"), _step("echo", "b", "Y")])
    request = _request("echoes")

    async def body(server: Server) -> InferenceResponse:
        return await server.infer(request)

    response = run_server(body, tmp_path)
    assert response.outputs[0].data is request.inputs[0].data


def test_a_finished_ensemble_request_leaves_no_garbage_cycles(tmp_path: Path, fake_backend: None) -> None:
    """Cycles (a step request referring to itself through its callback) pile up until the collector's pass,
    which then stalls the event loop: requests must be freed by reference counting alone."""
    write_model(tmp_path, "pre", "add", 1)
    write_model(tmp_path, "post", "add", 100)
    _ensemble(tmp_path, "pipe", [_step("pre", "X", "a"), _step("post", "a", "Y")])

    async def body(server: Server) -> list[str]:
        await server.infer(_request("pipe"))  # warm: plans and step models cached
        return await cyclic_garbage(lambda: server.infer(_request("pipe")))

    assert run_server(body, tmp_path) == []


def test_an_ensemble_may_use_another_ensemble(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "a", "add", 1)
    _ensemble(tmp_path, "inner", [_step("a", "X", "t"), _step("a", "t", "Y")])
    (tmp_path / "outer" / "1").mkdir(parents=True)
    (tmp_path / "outer" / "config.pbtxt").write_text(
        _ensemble_text("outer", ['{ model_name: "inner" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } }'])
    )

    async def body(server: Server) -> float:
        response = await server.infer(_request("outer", 1.0))
        return float(response.outputs[0].data[0, 0])

    assert run_server(body, tmp_path) == 3.0


def test_explicit_load_of_circular_ensembles_fails_instead_of_waiting_forever(tmp_path: Path, fake_backend: None) -> None:
    for name, other in (("first", "second"), ("second", "first")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(
            _ensemble_text(name, [f'{{ model_name: "{other}" model_version: -1 input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "Y" }} }}'])
        )

    async def body(server: Server) -> str:
        with pytest.raises(NereidError) as failed:
            await asyncio.wait_for(server.load_model("first"), 10)
        return failed.value.message

    message = run_server(body, tmp_path, mode="explicit")
    assert "circular dependency between ensembles: second -> first -> second" in message


def test_explicit_load_names_the_composing_model_that_failed(tmp_path: Path, fake_backend: None) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken" backend: "no_such_backend"')
    _ensemble(tmp_path, "uses_broken", [_step("broken", "X", "Y")])

    async def body(server: Server) -> tuple[str, list[dict[str, Any]]]:
        with pytest.raises(NereidError) as failed:
            await server.load_model("uses_broken")
        return failed.value.message, server.repository_index()

    message, index = run_server(body, tmp_path, mode="explicit")
    assert message.startswith(
        "load failed for model 'uses_broken': ensemble 'uses_broken' depends on 'broken' which has no loaded version. "
        "Model 'broken' loading failed with error: "
    )
    entry = next(e for e in index if e["name"] == "uses_broken")
    assert entry["state"] == "UNAVAILABLE" and "depends on 'broken'" in entry["reason"]


# -- graph checks on the config alone -------------------------------------------------------------------
def _config(text: str) -> Any:
    config = parse_pbtxt(text, "test")
    normalize(config, config.name)
    return config


@pytest.mark.parametrize(
    ("steps", "outputs", "expected"),
    [
        (
            [_step("m", "X", "a"), _step("m", "q", "Y")],
            ("Y",),
            "output 'Y' for ensemble 'e' is not written: at least one of its depending tensors, 'q', is not connected",
        ),
        ([_step("m", "X", "a"), _step("m", "a", "b")], ("Y",), "ensemble output 'Y' for ensemble e' is not used"),
        ([_step("m", "X", "a"), _step("m", "a", "Y"), _step("m", "a", "Y")], ("Y",), "ensemble tensor 'Y' can appear in an output map only once for ensemble 'e' step 2"),
        ([_step("m", "X", "Y"), _step("m", "X", "spare")], ("Y",), "ensemble tensor 'spare' is unused in ensemble 'e'"),
    ],
)
def test_graph_errors_say_which_tensor(steps: list[str], outputs: tuple[str, ...], expected: str) -> None:
    with pytest.raises(NereidError) as error:
        check_ensemble_config(_config(_ensemble_text("e", steps, outputs)), "e")
    assert error.value.message == expected
    assert error.value.status is Status.INVALID_ARG


def test_a_cycle_is_named_with_its_steps() -> None:
    steps = [_step("m", "X", "a"), _step("m", "c", "b"), _step("n", "b", "c"), _step("m", "a", "Y")]
    with pytest.raises(NereidError) as error:
        check_ensemble_config(_config(_ensemble_text("e", steps)), "e")
    assert error.value.message.startswith("ensemble tensor 'b' is unused in ensemble 'e'")
    assert "cycle" in error.value.message and "step 1 ('m')" in error.value.message and "step 2 ('n')" in error.value.message


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("instance_group [ { count: 1 } ]", "instance group should not be specified for ensemble 'e'"),
        ("optimization { input_pinned_memory { enable: true } }", "optimization should not be specified for ensemble 'e'"),
        ('backend: "python"', "Ensemble model 'e' must have platform type 'ensemble' and empty backend type"),
    ],
)
def test_fields_an_ensemble_may_not_have(extra: str, expected: str) -> None:
    with pytest.raises(NereidError) as error:
        check_ensemble_config(_config(_ensemble_text("e", [_step("m", "X", "Y")], extra=extra)), "e")
    assert error.value.message == expected


def test_missing_step_fields_and_unused_input() -> None:
    text = _ensemble_text("e", ['{ model_name: "m" output_map { key: "OUT" value: "Y" } }'])
    with pytest.raises(NereidError, match="must specify 'input_map' in step 0 of ensemble 'e'"):
        check_ensemble_config(_config(text), "e")
    text = _ensemble_text("e", [_step("m", "X", "Y")]).replace(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "W" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    )
    with pytest.raises(NereidError, match="ensemble input 'W' for ensemble e' is not used"):
        check_ensemble_config(_config(text), "e")


def test_ensemble_scheduling_on_a_non_ensemble_is_refused() -> None:
    config = _config('name: "m" backend: "python" ensemble_scheduling { step [ { model_name: "x" } ] }')
    with pytest.raises(NereidError, match="ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"):
        check_ensemble_config(config, "m")


# -- checks against the composing models ---------------------------------------------------------------
def _composing(decoupled: set[str] = frozenset(), max_batch_size: int = 8, data_type: int = mc.TYPE_FP32, dims: int = 4) -> Any:
    def lookup(step: Any) -> Any:
        config = mc.ModelConfig(name=step.model_name, max_batch_size=max_batch_size)
        config.input.add(name="IN", data_type=data_type, dims=[dims])
        config.output.add(name="OUT", data_type=data_type, dims=[dims])
        config.model_transaction_policy.decoupled = step.model_name in decoupled
        return config

    return lookup


def test_composing_checks_batch_size_types_and_shapes() -> None:
    config = _config(_ensemble_text("e", [_step("m", "X", "Y")], max_batch_size=16))
    with pytest.raises(NereidError, match="ensemble e allows maximum batch size 16, but it contains model m which only allows maximum batch size to be 8"):
        check_composing_models(config, _composing())
    config = _config(_ensemble_text("e", [_step("m", "X", "Y")]))
    with pytest.raises(NereidError, match="inconsistent data type: TYPE_FP32 is inferred from model e while TYPE_INT32 is inferred from model m"):
        check_composing_models(config, _composing(data_type=mc.TYPE_INT32))
    with pytest.raises(NereidError, match=r"ensemble tensor X: inconsistent shape: \[-1,4\] is inferred from model e while \[-1,5\]"):
        check_composing_models(config, _composing(dims=5))
    assert check_composing_models(config, _composing()) is False


def test_unmapped_and_unknown_step_tensors() -> None:
    text = _ensemble_text("e", ['{ model_name: "m" input_map { key: "NOPE" value: "X" } output_map { key: "OUT" value: "Y" } }'])
    with pytest.raises(NereidError, match="in ensemble e, ensemble tensor X is mapping to non-existing input NOPE in model m"):
        check_composing_models(_config(text), _composing())
    text = _ensemble_text("e", ['{ model_name: "m" input_map { key: "IN" value: "X" } output_map { key: "NOPE" value: "Y" } }'])
    with pytest.raises(NereidError, match="in ensemble e, ensemble tensor Y is mapped from non-existing output NOPE in model m"):
        check_composing_models(_config(text), _composing())


def test_joining_two_decoupled_streams_is_refused() -> None:
    two_inputs = '''name: "e" platform: "ensemble" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "r1" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "a" } },
  { model_name: "r2" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "b" } },
  { model_name: "join" model_version: -1 input_map { key: "A" value: "a" } input_map { key: "B" value: "b" } output_map { key: "OUT" value: "Y" } }
] }'''

    def lookup(step: Any) -> Any:
        config = mc.ModelConfig(name=step.model_name, max_batch_size=8)
        for name in ("A", "B") if step.model_name == "join" else ("IN",):
            config.input.add(name=name, data_type=mc.TYPE_FP32, dims=[4])
        config.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[4])
        config.model_transaction_policy.decoupled = step.model_name != "join"
        return config

    with pytest.raises(NereidError, match="step of model 'join' receives inputs originated from different decoupled models"):
        check_composing_models(_config(two_inputs), lookup)


def test_needed_steps_follow_the_graph_back_from_the_outputs() -> None:
    steps = [_step("a", "X", "t"), _step("b", "t", "Y"), _step("c", "X", "Z")]
    graph = EnsembleGraph.from_config(_config(_ensemble_text("e", steps, ("Y", "Z"))))
    assert graph.needed_steps(frozenset({"Y"})) == {0, 1}
    assert graph.needed_steps(frozenset({"Z"})) == {2}


def test_shapes_cross_between_batching_and_non_batching_sides_as_triton_does() -> None:
    # A tensor from a non-batching producer going to a batching model gets a batch of 1 when it fits the dims.
    assert _adapt((4,), True, 0, (4,)) == (1, 4)
    assert _adapt((4,), True, 0, (2, 4)) is None
    # A batch of 1 going to a non-batching model loses its batch dimension when it does not fit as it is.
    assert _adapt((4,), False, 1, (1, 4)) == (4,)
    assert _adapt((1, 4), False, 1, (1, 4)) is None
    assert _adapt((4,), True, 3, (3, 4)) is None
