"""The python backend driven directly: load_model -> create_instance -> execute, with real stub
processes running the models in tests/python_models."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

from tests.python_backend_support import (
    MODELS,
    PATIENCE_S,
    Started,
    context,
    outputs,
    request,
    tensor,
)
from tritonactor.backends.base import InstanceContext, InstanceDied
from tritonactor.backends.python import PythonBackend, PythonInstance, ipc
from tritonactor.backends.python import triton_python_backend_utils as pb_utils
from tritonactor.backends.python.backend import interpreter_for
from tritonactor.config.model_config import config_to_json, parse_pbtxt, read_pbtxt
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)


def add_sub_request(a: np.ndarray, b: np.ndarray, model: str = "add_sub") -> InferenceRequest:
    return request(model, tensor("INPUT0", a), tensor("INPUT1", b))


# ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_add_sub_runs_unchanged(start_either: Started) -> None:
    instance = start_either("add_sub")
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    [result] = await instance.execute([add_sub_request(a, b)])
    got = outputs(result)
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    assert got["OUTPUT0"].dtype == np.float32
    assert result.model_name == "add_sub" and result.model_version == "1"


@pytest.mark.anyio
async def test_batch_of_requests_and_requested_outputs(start_either: Started) -> None:
    instance = start_either("add_sub")
    ones = np.ones(4, dtype=np.float32)
    only_diff = add_sub_request(ones, ones)
    only_diff.outputs = [RequestedOutput("OUTPUT1")]
    only_diff.id = "r2"
    results = await instance.execute([add_sub_request(ones, 2 * ones), only_diff])
    assert set(outputs(results[0])) == {"OUTPUT0", "OUTPUT1"}
    assert set(outputs(results[1])) == {"OUTPUT1"}
    assert results[1].id == "r2"


@pytest.mark.anyio
async def test_initialize_args_and_request_accessors(start: Started) -> None:
    instance = start("introspect")
    data = np.array([1.5, 2.5], dtype=np.float32)
    req = request(
        "introspect",
        tensor("INPUT0", data),
        id="abc",
        parameters={"sequence_id": 7, "sequence_start": True, "timeout": 500, "flavour": "mint"},
        outputs=[RequestedOutput("ARGS"), RequestedOutput("REQUEST"), RequestedOutput("DLPACK")],
    )
    [result] = await instance.execute([req])
    got = outputs(result)
    args = json.loads(got["ARGS"][0])
    assert args["model_name"] == "introspect"
    assert args["model_version"] == "1"
    assert args["model_instance_name"] == "introspect_0_0"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(MODELS / "introspect")
    config = json.loads(args["model_config"])
    assert config["name"] == "introspect"
    assert config["parameters"]["greeting"]["string_value"] == "hello"
    seen = json.loads(got["REQUEST"][0])
    assert seen == {
        "request_id": "abc",
        "correlation_id": 7,
        "flags": 1,  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        "timeout": 500,
        "parameters": {"flavour": "mint"},
        "parameters_text": '{"flavour":"mint"}',
        "requested_output_names": ["ARGS", "DLPACK", "REQUEST"],
        "inputs": ["INPUT0"],
        "model_dir": str(MODELS / "introspect" / "1"),
    }
    np.testing.assert_array_equal(got["DLPACK"], data)


@pytest.mark.anyio
async def test_bytes_round_trip_keeps_empty_and_non_ascii(start_either: Started) -> None:
    instance = start_either("identity_bytes")
    items = [b"", "h\u00e9llo w\u00f6rld \u2603".encode(), b"\x00\xff binary", b"plain"]
    data = np.array(items, dtype=np.object_)
    [result] = await instance.execute([request("identity_bytes", tensor("INPUT0", data))])
    echoed = outputs(result)["OUTPUT0"]
    assert echoed.dtype == np.object_
    assert list(echoed) == items


FAULTY_MODEL = MODELS / "faulty" / "1" / "model.py"


@pytest.mark.anyio
async def test_execute_that_raises_fails_the_batch_and_the_process_stays(
    start_either: Started,
) -> None:
    instance = start_either("faulty")
    one = np.array([0], dtype=np.int32)
    results = await instance.execute(
        [request("faulty", tensor("INPUT0", one)), request("faulty", tensor("INPUT0", one + 5))]
    )
    for result in results:
        assert isinstance(result, TritonError)
        assert result.code == ErrorCode.INTERNAL
        # the model's words and where in its code, as Triton's python backend says them
        assert result.message == (
            "Failed to process the request(s) for model 'faulty_0_0', message: ValueError: the "
            f"model was asked to fail\n\nAt:\n  {FAULTY_MODEL}(15): execute\n"
        )
    [ok] = await instance.execute([request("faulty", tensor("INPUT0", one + 5))])
    assert outputs(ok)["OUTPUT0"].tolist() == [5]


@pytest.mark.anyio
async def test_an_exception_without_a_message_is_named_as_triton_names_it(
    start: Started,
) -> None:
    instance = start("faulty")
    [result] = await instance.execute(
        [request("faulty", tensor("INPUT0", np.array([-1], np.int32)))]
    )
    assert isinstance(result, TritonError)
    assert result.message == (
        "Failed to process the request(s) for model 'faulty_0_0', message: ValueError: "
        f"<EMPTY MESSAGE>\n\nAt:\n  {FAULTY_MODEL}(17): execute\n"
    )


@pytest.mark.anyio
async def test_a_model_without_execute_or_without_its_class_fails_in_tritons_words(
    start: Started, tmp_path: Path
) -> None:
    config = (MODELS / "faulty" / "config.pbtxt").read_text().replace('"faulty"', '"no_execute"')
    for name, source in (
        ("no_execute", "class TritonPythonModel:\n    def initialize(self, args):\n        pass\n"),
        ("no_class", "class Model:\n    pass\n"),
    ):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config.replace("no_execute", name))
        (tmp_path / name / "1" / "model.py").write_text(source)
    instance = start("no_execute", model_context=context("no_execute", tmp_path))
    [result] = await instance.execute(
        [request("no_execute", tensor("INPUT0", np.array([5], np.int32)))]
    )
    assert isinstance(result, TritonError) and result.code == ErrorCode.INTERNAL
    model_file = tmp_path / "no_execute" / "1" / "model.py"
    assert result.message == (
        "Failed to process the request(s) for model 'no_execute_0_0', message: Python model "
        f"{model_file} does not implement `execute` method."
    )
    with pytest.raises(TritonError) as failed:
        start("no_class", model_context=context("no_class", tmp_path))
    assert "AttributeError: module '1.model' has no attribute 'TritonPythonModel'" in str(
        failed.value
    ), failed.value


@pytest.mark.anyio
async def test_model_py_is_imported_as_tritons_stub_imports_it(
    start: Started, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.py is the module `1.model` of a package that is its version's folder: a relative
    import of a sibling works (it failed: no parent package), the folder's `__init__.py` runs,
    a file beside model.py reads through `importlib.resources`, and `__name__` is Triton's; a
    folder named `1` in the working folder is not that package."""
    config = (MODELS / "faulty" / "config.pbtxt").read_text().replace('"faulty"', '"relative"')
    (tmp_path / "relative" / "1").mkdir(parents=True)
    (tmp_path / "relative" / "config.pbtxt").write_text(config)
    (tmp_path / "relative" / "1" / "helper.py").write_text("class Base:\n    pass\n")
    (tmp_path / "relative" / "1" / "__init__.py").write_text("FLAG = 'from __init__'\n")
    (tmp_path / "relative" / "1" / "data.txt").write_text("beside")
    (tmp_path / "relative" / "1" / "model.py").write_text(
        "from importlib import resources\n\nfrom . import FLAG\nfrom .helper import Base\n\n\n"
        "class TritonPythonModel(Base):\n    def execute(self, requests):\n"
        "        data = resources.files(__package__).joinpath('data.txt').read_text()\n"
        "        raise ValueError(f'{__name__} {FLAG} {data}')\n"
    )
    # The model's process works in a folder holding another `1/model.py` (its working folder is
    # on its `sys.path`): not the one imported.
    decoy = tmp_path / "elsewhere"
    (decoy / "1").mkdir(parents=True)
    (decoy / "1" / "model.py").write_text("raise RuntimeError('the wrong model.py')\n")
    monkeypatch.chdir(decoy)
    instance = start("relative", model_context=context("relative", tmp_path))
    [result] = await instance.execute(
        [request("relative", tensor("INPUT0", np.array([5], np.int32)))]
    )
    assert isinstance(result, TritonError)
    assert result.message.startswith(
        "Failed to process the request(s) for model 'relative_0_0', message: ValueError: 1.model "
        "from __init__ beside"
    ), result.message


SPAWNING_MODEL = """
import multiprocessing

import numpy as np
import triton_python_backend_utils as pb_utils


def square(value):
    return value * value


class TritonPythonModel:
    def execute(self, requests):
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            squared = pool.apply_async(square, (7,)).get(timeout=120)
        output = pb_utils.Tensor("OUTPUT0", np.array([squared], dtype=np.int32))
        return [pb_utils.InferenceResponse([output]) for _ in requests]
"""


@pytest.mark.anyio
async def test_a_process_the_model_spawns_imports_model_py_and_the_helpers(
    start: Started, tmp_path: Path
) -> None:
    """multiprocessing's spawn re-imports model.py in the child, which imports
    `triton_python_backend_utils` by its Triton name: found there as in Triton's stub (it
    failed, and the pool waited for ever)."""
    config = (MODELS / "faulty" / "config.pbtxt").read_text().replace('"faulty"', '"spawning"')
    (tmp_path / "spawning" / "1").mkdir(parents=True)
    (tmp_path / "spawning" / "config.pbtxt").write_text(config)
    (tmp_path / "spawning" / "1" / "model.py").write_text(SPAWNING_MODEL)
    instance = start("spawning", model_context=context("spawning", tmp_path))
    [result] = await instance.execute(
        [request("spawning", tensor("INPUT0", np.array([5], np.int32)))]
    )
    assert outputs(result)["OUTPUT0"].tolist() == [49], result


@pytest.mark.anyio
async def test_response_error_fails_only_that_request(start_either: Started) -> None:
    instance = start_either("faulty")
    bad = request("faulty", tensor("INPUT0", np.array([1], dtype=np.int32)))
    good = request("faulty", tensor("INPUT0", np.array([3], dtype=np.int32)))
    error, result = await instance.execute([bad, good])
    assert isinstance(error, TritonError)
    assert error.code == ErrorCode.INVALID_ARG
    assert error.message == "one is not allowed"
    assert outputs(result)["OUTPUT0"].tolist() == [3]


@pytest.mark.anyio
async def test_async_execute(start: Started) -> None:
    instance = start("async_add")
    data = np.array([[1, 2, 3]], dtype=np.float32)
    [result] = await instance.execute([request("async_add", tensor("INPUT0", data))])
    np.testing.assert_array_equal(outputs(result)["OUTPUT0"], data + 1)


@pytest.mark.anyio
async def test_decoupled_responses_arrive_after_execute_returned(start: Started) -> None:
    instance = start("repeat")
    received: list[tuple[InferenceResponse | None, TritonError | None, bool]] = []
    done = anyio.Event()
    token = anyio.lowlevel.current_token()

    def deliver(response, error, final):  # type: ignore[no-untyped-def]
        received.append((response, error, final))
        if final:
            anyio.from_thread.run_sync(done.set, token=token)

    req = request("repeat", tensor("IN", np.array([4, 5, 6], dtype=np.int32)))
    req.sender = ResponseSender(deliver)
    assert await instance.execute([req]) == [None]
    with anyio.fail_after(PATIENCE_S):
        await done.wait()
    assert [r is not None for r, _, _ in received] == [True, True, True, False]
    assert [final for _, _, final in received] == [False, False, False, True]
    values = [(outputs(r)["OUT"].tolist(), outputs(r)["IDX"].tolist()) for r, _, _ in received[:3]]
    assert values == [([4], [0]), ([5], [1]), ([6], [2])]
    assert all(error is None for _, error, _ in received)


class Collected:
    """What a decoupled request's sender received, with a wait for the n-th answer."""

    def __init__(self) -> None:
        self.received: list[tuple[InferenceResponse | None, TritonError | None, bool]] = []
        self.arrived = anyio.Event()
        self.token = anyio.lowlevel.current_token()

    def deliver(self, response, error, final) -> None:  # type: ignore[no-untyped-def]
        self.received.append((response, error, final))
        anyio.from_thread.run_sync(self._wake, token=self.token)

    def _wake(self) -> None:
        self.arrived.set()
        self.arrived = anyio.Event()

    async def until(self, count: int, seconds: float = PATIENCE_S) -> None:
        with anyio.fail_after(seconds):
            while len(self.received) < count:
                await self.arrived.wait()

    async def final(self, seconds: float = PATIENCE_S) -> dict[str, np.ndarray]:
        with anyio.fail_after(seconds):
            while not (self.received and self.received[-1][2]):
                await self.arrived.wait()
        response, error, _ = self.received[-1]
        assert error is None, error
        return outputs(response)


def cancellable(interval_ms: int = 20, **parameters: object) -> InferenceRequest:
    data = np.array([interval_ms], dtype=np.int32)
    return request("cancellable", tensor("INTERVAL_MS", data), parameters=dict(parameters))


@pytest.mark.anyio
@pytest.mark.parametrize("check", ["sender", "request"])
async def test_decoupled_model_sees_cancellation_while_it_streams(
    start: Started, check: str
) -> None:
    instance = start("cancellable")
    collected = Collected()
    # The model stops by itself only after twice the bound on the wait for its final answer.
    req = cancellable(check=check, limit_s=2 * PATIENCE_S)
    req.sender = ResponseSender(collected.deliver)
    assert await instance.execute([req]) == [None]
    await collected.until(2)
    assert not any(final for _, _, final in collected.received)
    req.cancel()
    last = await collected.final(seconds=PATIENCE_S)
    assert last["CANCELLED"].tolist() == [True]  # it stopped because it saw the cancellation
    assert last["INDEX"].tolist() == [len(collected.received) - 1] and last["INDEX"][0] >= 2


@pytest.mark.anyio
async def test_request_cancelled_before_execute_is_seen_at_once(
    start: Started, tmp_path: Path
) -> None:
    instance = start("cancellable")
    collected = Collected()
    req = cancellable(marker=str(tmp_path / "marker"))
    req.sender = ResponseSender(collected.deliver)
    req.cancel()
    assert await instance.execute([req]) == [None]
    last = await collected.final()
    assert (last["INDEX"].tolist(), last["CANCELLED"].tolist()) == ([0], [True])
    assert len(collected.received) == 1
    assert (tmp_path / "marker").read_text() == "cancelled"


@pytest.mark.anyio
async def test_uncancelled_requests_read_not_cancelled(start: Started) -> None:
    instance = start("cancellable")
    collected = Collected()
    req = cancellable(interval_ms=1, limit_s=0.2)
    req.sender = ResponseSender(collected.deliver)
    assert await instance.execute([req]) == [None]
    last = await collected.final()
    assert last["CANCELLED"].tolist() == [False]
    assert last["INDEX"][0] >= 1  # it asked, and was told False every time until its limit


def polling_cancellable(backend: PythonBackend) -> PythonInstance:
    """An instance of `cancellable` made not decoupled: its execute polls until cancelled."""
    ctx = context("cancellable")
    assert ctx.config.model_transaction_policy is not None
    ctx.config.model_transaction_policy.decoupled = False
    return backend.load_model(ctx).create_instance(
        InstanceContext("cancellable_0_0", "KIND_CPU", 0, 0)
    )


@pytest.mark.anyio
async def test_non_decoupled_execute_sees_cancellation(
    backend: PythonBackend, tmp_path: Path
) -> None:
    instance = polling_cancellable(backend)
    try:
        polling = tmp_path / "polling"
        req = cancellable(interval_ms=10, marker=str(tmp_path / "marker"), polling=str(polling))
        results: list[object] = []

        async def run() -> None:
            results.extend(await instance.execute([req]))

        with anyio.fail_after(30):  # the model stops by itself only after 10 s
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                while not polling.exists():  # cancelled while the model polls
                    await anyio.sleep(0.01)
                req.cancel()
        got = outputs(results[0])
        assert got["CANCELLED"].tolist() == [True] and got["INDEX"][0] >= 1
        assert (tmp_path / "marker").read_text() == "cancelled"
        # An uncancelled request of the same instance reads False until its limit.
        [result] = await instance.execute([cancellable(interval_ms=1, limit_s=0.1)])
        assert outputs(result)["CANCELLED"].tolist() == [False]
    finally:
        instance.finalize()


@pytest.mark.anyio
async def test_an_abandoned_executes_late_answer_is_dropped_quietly(
    backend: PythonBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server gives up waiting on an execute (its caller is cancelled); the model answers
    later, its small tensors inside the message: the answer is dropped, nothing is logged as
    a failure, and the next execute is served."""
    instance = polling_cancellable(backend)
    try:
        polling = tmp_path / "polling"
        abandoned = cancellable(interval_ms=10, limit_s=0.3, polling=str(polling))
        async with anyio.create_task_group() as group:
            group.start_soon(instance.execute, [abandoned])
            while not polling.exists():  # the model has the request
                await anyio.sleep(0.01)
            group.cancel_scope.cancel()  # nobody waits for its answer any more
        # The stub answers in order: this execute's answer comes after the abandoned one's.
        [result] = await instance.execute([cancellable(interval_ms=1, limit_s=0.05)])
        assert outputs(result)["CANCELLED"].tolist() == [False]
        failures = [r for r in caplog.records if "cannot handle a message" in r.getMessage()]
        assert failures == []
    finally:
        instance.finalize()


def test_pb_utils_is_cancelled_outside_a_server() -> None:
    built = pb_utils.InferenceRequest(model_name="m")  # a BLS request the model built
    assert built.is_cancelled() is False
    assert pb_utils.ResponseSender(0).is_cancelled() is False


@pytest.mark.anyio
@pytest.mark.parametrize("made_on", ["the loop", "a worker thread"])
async def test_bls_calls_the_servers_infer(start_either: Started, made_on: str) -> None:
    """Made on the loop's own thread, an instance reads its model's calls on a thread of its
    own and serves them from a pool; made on a worker thread of the loop, as the server makes
    them, it reads and serves them on the loop: both answer alike, errors too."""
    calls: list[InferenceRequest] = []

    async def infer(req: InferenceRequest) -> InferenceResponse:
        calls.append(req)
        if req.model_name == "complex":  # an answer no Triton datatype can carry
            value = Tensor(name="OUTPUT0", datatype="FP64", shape=(4,), data=np.ones(4, "c8"))
            return InferenceResponse(model_name=req.model_name, model_version="1", outputs=[value])
        if req.model_name != "onnx_add_sub":
            raise TritonError(ErrorCode.NOT_FOUND, f"no model '{req.model_name}'")
        a, b = req.inputs[0].data, req.inputs[1].data
        everything = {"OUTPUT0": a + b, "OUTPUT1": a - b}
        return InferenceResponse(
            model_name=req.model_name,
            model_version="1",
            outputs=[tensor(name, everything[name]) for name in req.requested_output_names],
        )

    if made_on == "the loop":
        instance = start_either("bls", infer=infer)
    else:
        instance = await anyio.to_thread.run_sync(start_either, "bls", infer)
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    [result] = await instance.execute([add_sub_request(a, b, model="bls")])
    got = outputs(result)
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    assert [c.requested_output_names for c in calls] == [["OUTPUT0"], ["OUTPUT1"]]
    assert calls[0].model_version == ""

    missing = add_sub_request(a, b, model="bls")
    missing.parameters = {"model": "nowhere"}
    [error] = await instance.execute([missing])
    assert isinstance(error, TritonError)
    assert error.code == ErrorCode.INTERNAL  # (a BLS caller sees every error so, as in Triton)
    assert error.message == "no model 'nowhere'"

    unwritable = add_sub_request(a, b, model="bls")
    unwritable.parameters = {"model": "complex"}
    with anyio.fail_after(PATIENCE_S):  # (only keeps a bug from hanging here)
        [error] = await instance.execute([unwritable])
    assert isinstance(error, TritonError)
    assert "complex64" in error.message
    assert (instance._calls._pool is None) == (made_on == "a worker thread")


@pytest.mark.anyio
async def test_bls_calls_of_one_execute_are_all_under_way_at_once(start_either: Started) -> None:
    """A model's BLS calls are served side by side, however many there are (Triton sets no
    limit): `bls_fanout`'s 16 calls, awaited together, are all asked before any is answered.
    An instance made on a worker thread of the server's loop (as the server makes them) has
    its calls read and served on that loop, no thread of the call pool taken."""
    asked: list[InferenceRequest] = []
    all_asked = anyio.Event()

    async def infer(req: InferenceRequest) -> InferenceResponse:
        asked.append(req)
        if len(asked) == 16:
            all_asked.set()
        await all_asked.wait()
        return InferenceResponse(
            model_name=req.model_name,
            model_version="1",
            outputs=[tensor("OUTPUT0", req.inputs[0].data)],
        )

    instance = await anyio.to_thread.run_sync(start_either, "bls_fanout", infer)
    x = np.arange(4, dtype=np.float32)
    with anyio.fail_after(PATIENCE_S):  # (only keeps a bug from hanging here)
        [result] = await instance.execute([request("bls_fanout", tensor("INPUT0", x))])
    np.testing.assert_array_equal(outputs(result)["OUTPUT0"], 16 * x)
    assert [(c.model_name, c.requested_output_names) for c in asked] == [
        ("identity", ["OUTPUT0"])
    ] * 16
    assert instance._calls._pool is None


@pytest.mark.anyio
@pytest.mark.parametrize(("value", "how"), [(1, "code 1"), (2, "signal SIGKILL")])
async def test_process_death_mid_request_raises_instance_died(
    start: Started, value: int, how: str
) -> None:
    instance = start("crash")
    with pytest.raises(InstanceDied) as died:
        await instance.execute([request("crash", tensor("INPUT0", np.array([value], np.int32)))])
    assert str(died.value) == f"python model process for instance 'crash_0_0' exited with {how}"
    # A new instance in its place serves again: create_instance can be called again.
    again = start("crash", index=0)
    [result] = await again.execute([request("crash", tensor("INPUT0", np.array([0], np.int32)))])
    assert outputs(result)["PID"].tolist() == [again.pid]


@pytest.mark.anyio
async def test_death_while_idle_is_noticed_at_once(start: Started) -> None:
    instance = start("crash")
    died = threading.Event()
    instance.on_death(lambda reason: died.set())
    os.kill(instance.pid, signal.SIGKILL)
    # Noticed with no request under way (the hang guard only keeps a bug from hanging here).
    assert await anyio.to_thread.run_sync(died.wait, 30)
    with anyio.fail_after(30), pytest.raises(InstanceDied, match="exited with signal SIGKILL"):
        await instance.execute([request("crash", tensor("INPUT0", np.array([0], np.int32)))])


def test_initialize_failure_fails_create_instance(backend: PythonBackend, tmp_path: Path) -> None:
    model_dir = tmp_path / "broken"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('no weights here')\n"
    )
    (model_dir / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    model = backend.load_model(context("broken", tmp_path))
    with pytest.raises(TritonError) as caught:
        model.create_instance(InstanceContext("broken_0", "KIND_CPU", 0, 0))
    # The model's words and where in its code, as Triton's python backend says them ("At:",
    # file(line): name), nothing before them (Triton's status word aside: docs/decisions.md).
    model_file = model_dir / "1" / "model.py"
    assert caught.value.message == (
        f"RuntimeError: no weights here\n\nAt:\n  {model_file}(3): initialize\n"
    )


def test_auto_complete_config(backend: PythonBackend) -> None:
    config = read_pbtxt(MODELS / "autocomplete" / "config.pbtxt")
    completed = config_to_json(backend.auto_complete_config(config, MODELS / "autocomplete" / "1"))
    assert completed["max_batch_size"] == 4
    assert [(i["name"], i["data_type"], i["dims"]) for i in completed["input"]] == [
        ("INPUT0", "TYPE_INT32", [-1])
    ]
    assert [o["name"] for o in completed["output"]] == ["OUTPUT0"]
    assert "dynamic_batching" in completed
    # A model without the hook keeps its config (and costs no process).
    plain = read_pbtxt(MODELS / "add_sub" / "config.pbtxt")
    assert backend.auto_complete_config(plain, MODELS / "add_sub" / "1") is plain


def test_auto_complete_conflict_fails(backend: PythonBackend) -> None:
    # Triton's rule: the model may raise the config's max_batch_size (2 becomes 4), not lower
    # it (8 stays, and the load fails in Triton's words).
    config = parse_pbtxt('name: "autocomplete"\nbackend: "python"\nmax_batch_size: 2\n')
    raised = backend.auto_complete_config(config, MODELS / "autocomplete" / "1")
    assert raised.max_batch_size == 4
    config = parse_pbtxt('name: "autocomplete"\nbackend: "python"\nmax_batch_size: 8\n')
    with pytest.raises(TritonError) as caught:
        backend.auto_complete_config(config, MODELS / "autocomplete" / "1")
    assert (
        "configuration specified max_batch_size 8, but in auto-complete-config function for "
        "model 'autocomplete' specified max_batch_size 4" in caught.value.message
    )


def test_auto_complete_must_return_the_config(backend: PythonBackend, tmp_path: Path) -> None:
    model = tmp_path / "returns_none"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        config.set_max_batch_size(2)\n"
    )
    config = parse_pbtxt('name: "returns_none"\nbackend: "python"\n')
    with pytest.raises(TritonError) as caught:
        backend.auto_complete_config(config, model / "1")
    assert (
        "auto_complete_config function in model 'returns_none' must return a valid "
        "pb.ModelConfig object." in caught.value.message
    )


def test_execution_env_path(tmp_path: Path) -> None:
    config = parse_pbtxt(
        'name: "m"\nbackend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value: '
        '{ string_value: "$$TRITON_MODEL_DIRECTORY/env" } }\n'
    )
    venv = tmp_path / "env" / "bin"
    venv.mkdir(parents=True)
    (venv / "python3").symlink_to(sys.executable)
    assert interpreter_for(config, tmp_path) == str(venv / "python3")
    with pytest.raises(TritonError, match="neither a python executable"):
        interpreter_for(config, tmp_path / "elsewhere")


def test_pb_utils_helpers() -> None:
    items = np.array([b"a", b"", "\u00e9".encode()], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(items)
    # plain bytes, as Triton's pb_utils gives them
    assert encoded == b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == list(items)
    packed = b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert pb_utils.serialize_byte_tensor(np.array([b"ab", b"c"])) == packed  # an `S` array
    assert pb_utils.serialize_byte_tensor(np.empty([0], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.ones(2, np.float32)) is None
    assert pb_utils.serialize_byte_tensor(np.array(["ab"])) is None  # `U`: None, as Triton's
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_UINT16"] is np.uint16
    for unknown in ("TYPE_BF16", "FP32", "TYPE_BYTES", ""):
        with pytest.raises(KeyError):
            pb_utils.triton_string_to_numpy(unknown)
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype(np.float32)) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    for other in (bool, int, float, str, bytes, object, "float32", np.dtype("S5"), None):
        assert pb_utils.numpy_to_triton_type(other) is None, other
    assert pb_utils.Tensor(b"A", np.ones(1, np.int8)).name() == "A"
    assert pb_utils.Tensor("A", np.ones(1, np.float32)).triton_dtype() == 11
    assert (int(pb_utils.TRITONSERVER_MEMORY_GPU), int(pb_utils.TRITONSERVER_MEMORY_CPU)) == (0, 1)
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": []}
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("nope", pb_utils.TritonError.NOT_FOUND)
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error() and response.error() is error
    t = pb_utils.Tensor("X", np.arange(3, dtype=np.int64))
    assert pb_utils.Tensor.from_dlpack("Y", t.to_dlpack()).as_numpy().tolist() == [0, 1, 2]


@pytest.mark.anyio
async def test_model_runs_under_the_execution_env_interpreter(
    backend: PythonBackend, tmp_path: Path
) -> None:
    import sysconfig
    import venv

    # An execution environment with the stub's one dependency, numpy, installed: here by a
    # .pth naming this interpreter's site-packages. A venv's system site-packages are its base
    # interpreter's, which need not hold numpy (Debian's python3.11 does not).
    venv.EnvBuilder(symlinks=True).create(tmp_path / "env")
    env_purelib = sysconfig.get_path("purelib", scheme="venv", vars={"base": str(tmp_path / "env")})
    Path(env_purelib, "suite.pth").write_text(str(Path(np.__file__).parents[1]) + "\n")
    ctx = context("add_sub")
    from tritonactor._proto.inference import ModelParameter

    ctx.config.parameters["EXECUTION_ENV_PATH"] = ModelParameter(string_value=str(tmp_path / "env"))
    instance = backend.load_model(ctx).create_instance(
        InstanceContext("add_sub_0_0", "KIND_CPU", 0, 0)
    )
    try:
        command = Path(f"/proc/{instance.pid}/cmdline").read_bytes().split(b"\0")[0]
        assert command.decode() == str(tmp_path / "env" / "bin" / "python3")
        ones = np.ones(4, dtype=np.float32)
        [result] = await instance.execute([add_sub_request(ones, ones)])
        np.testing.assert_array_equal(outputs(result)["OUTPUT0"], ones + ones)
    finally:
        instance.finalize()


def test_stub_that_does_not_start_in_time_is_killed(tmp_path: Path) -> None:
    """stub-timeout-seconds: a "python" that never says it started (it only sleeps) is killed
    and the instance fails UNAVAILABLE, naming the setting."""
    from tritonactor.backends.python.backend import PythonModel
    from tritonactor.backends.python.process import StubSettings

    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    model = PythonModel(context("add_sub"), str(silent), StubSettings(start_timeout_s=0.5))
    with pytest.raises(TritonError) as failed:
        model.create_instance(InstanceContext("add_sub_0_0", "KIND_CPU", 0, 0))
    assert failed.value.code is ErrorCode.UNAVAILABLE
    assert "did not answer within 0.5 s (stub-timeout-seconds)" in failed.value.message


@pytest.mark.anyio
async def test_backend_settings_size_the_arenas(tmp_path: Path) -> None:
    """shm-default-byte-size: the instance's input arena starts at that size."""
    from tritonactor.backends.python.backend import PythonModel
    from tritonactor.backends.python.process import StubSettings

    settings = StubSettings(shm_default_size=3 << 20, shm_growth_size=1 << 20)
    model = PythonModel(context("add_sub"), sys.executable, settings)
    instance = model.create_instance(InstanceContext("add_sub_0_0", "KIND_CPU", 0, 0))
    try:
        big = np.ones(1 << 18, dtype=np.float32)  # 2 x 1 MiB: above the usual 1 MiB limit
        [result] = await instance.execute([add_sub_request(big, big, "add_sub")])
        assert outputs(result)["OUTPUT0"].shape == big.shape
        assert instance._inputs_arena.size == 3 << 20
    finally:
        instance.finalize()


@pytest.mark.anyio
async def test_a_finalized_model_process_clears_the_instances_shared_memory(
    start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stub, once finalized, clears the server's side of this instance's files (what the
    server wrote for it): a server that unloads (on a SIGTERM) and is killed before it clears
    its side leaves none behind."""
    instance = start("add_sub")
    ones = np.ones(ipc.INLINE_LIMIT // 4, dtype=np.float32)  # past the inline limit
    await instance.execute([add_sub_request(ones, ones)])  # the server's arena now exists
    prefix = instance._stub.parent_prefix.removesuffix(ipc.SERVER_SIDE)
    # This process plays a server killed now: it clears nothing of its own any more.
    monkeypatch.setattr(ipc, "remove_files", lambda prefix: None)
    monkeypatch.setattr(ipc.Arena, "close", lambda self: None)

    def files() -> list[str]:
        return [name for name in os.listdir(ipc.SHM_DIR) if name.startswith(prefix + "-")]

    assert any(name.startswith(instance._stub.parent_prefix) for name in files())
    # What the server's finalize sends, without the server's own clearing that follows it.
    instance._stub.channel.send({"op": "finalize"})
    assert await anyio.to_thread.run_sync(instance._stub.process.wait, 30) == 0
    assert files() == []


@pytest.mark.parametrize(
    ("where", "imported"),
    [("1/base.py", "from .base import Base"), ("common.py", "from common import Base")],
    ids=["beside-model-py", "in-the-model-folder"],
)
def test_an_auto_complete_config_inherited_from_the_models_folder_runs(
    tmp_path: Path, where: str, imported: str
) -> None:
    """model.py need not name `auto_complete_config`: a base class it imports from beside it,
    or from its model's folder, may define it (it was skipped, model.py's own text not naming
    it), even where the config names its tensors already."""
    model = tmp_path / "inherits"
    (model / "1").mkdir(parents=True)
    (model / where).write_text(
        "class Base:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        config.set_max_batch_size(8)\n"
        "        return config\n"
    )
    (model / "1" / "model.py").write_text(
        f"{imported}\n\n\nclass TritonPythonModel(Base):\n"
        "    def execute(self, requests):\n        return []\n"
    )
    config = parse_pbtxt(
        'name: "inherits" input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    )
    completed = PythonBackend().auto_complete_config(config, model / "1")
    assert completed.max_batch_size == 8
