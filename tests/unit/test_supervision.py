"""An instance that reports its own death (`backends.lifetime.WatchedInstance`) is replaced when
it dies, with no request sent; a batch handed to it in the instant before its death was
reported (`BatchNotRun`) runs on the replacement, except where the scheduler cannot take it
back. The python backend's real process is killed in tests/e2e/test_supervision_e2e.py."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tritonactor.actors import Actor, ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.backends.lifetime import BatchNotRun, WatchedInstance
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.messages import VersionHealth
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

WAIT = 30  # s: the bound on a wait for something bound to happen (only a hang reaches it)

CONFIG = """
name: "m"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ORDERED = """
name: "m"
max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preserve_ordering: true }
"""


class Mortal(BackendInstance):
    """Dies when told to: reporting it (as a process's reader thread does) or not yet."""

    def __init__(self, backend: MortalBackend, generation: int) -> None:
        self.backend = backend
        self.generation = generation
        self.death: str | None = None
        self.watchers: list[Callable[[str], None]] = []

    def on_death(self, callback: Callable[[str], None]) -> None:
        if self.death is not None:
            callback(self.death)
        else:
            self.watchers.append(callback)

    def die(self, reason: str, report: bool = True) -> None:
        self.death = reason
        if report:  # from another thread, as the python backend's reader does
            thread = threading.Thread(target=lambda: [w(reason) for w in self.watchers])
            thread.start()
            thread.join()

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        if self.death is not None:
            raise BatchNotRun(self.death)
        self.backend.executed.append(self.generation)
        return [InferenceResponse(r.model_name, str(self.generation)) for r in requests]

    def finalize(self) -> None:
        self.backend.finalized.append(self.generation)


class MortalModel(BackendModel):
    def __init__(self, backend: MortalBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        if self.backend.refuse:  # (on a worker thread) a replacement that cannot start
            self.backend.refused.append(context.name)
            raise RuntimeError("no weights")
        instance = Mortal(self.backend, len(self.backend.instances) + 1)
        self.backend.instances.append(instance)
        self.backend.created.set()
        return instance


class MortalBackend(Backend):
    name = "mortal"

    def __init__(self) -> None:
        self.instances: list[Mortal] = []
        self.executed: list[int] = []
        self.finalized: list[int] = []
        self.created = anyio.Event()
        self.refuse = False
        self.refused: list[str] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return MortalModel(self)


class Owner(Actor[Any]):
    """The model-version actor's parent, as the manager is: hears its `VersionHealth`."""

    def __init__(self) -> None:
        super().__init__("owner")
        self.health: list[tuple[bool, str]] = []
        self.heard = anyio.Event()

        self.failed: list[str] = []

    async def receive(self, message: Any) -> None:
        if isinstance(message, VersionHealth):
            self.health.append((message.ready, message.reason))
            self.heard.set()
            self.heard = anyio.Event()

    async def on_child_failed(self, child: Any, error: BaseException) -> None:
        self.failed.append(str(error))  # the version failed as a whole


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(
    system: ActorSystem, config: str, tmp_path: Path
) -> tuple[MortalBackend, Owner, Router]:
    parsed = fill_defaults(parse_pbtxt(config), gpus=0)
    context = ModelContext("m", 1, parsed, tmp_path, tmp_path / "1", tmp_path / "1" / "m")
    backend = MortalBackend()
    owner = Owner()
    await system.spawn(owner)
    version = ModelVersionActor(backend, context)
    owner_actor: Actor[Any] = owner
    await owner_actor.spawn(version)
    assert version.scheduler is not None
    router = Router()
    router.known.add("m")
    signature = ModelSignature.from_config(parsed)
    router.add(ModelHandle("m", 1, parsed, signature, version.scheduler))
    return backend, owner, router


def request(config: str) -> InferenceRequest:
    shape = (1, 1) if "max_batch_size: 2" in config else (1,)
    data = np.ones(shape, np.float32)
    return InferenceRequest("m", inputs=[Tensor("X", "FP32", shape, data)])


async def wait_health(owner: Owner, count: int) -> None:
    with anyio.fail_after(WAIT):
        while len(owner.health) < count:
            await owner.heard.wait()


def test_the_python_instance_is_watched() -> None:
    from tritonactor.backends.python.instance import PythonInstance

    assert issubclass(PythonInstance, WatchedInstance)
    assert not issubclass(BackendInstance, WatchedInstance)


async def test_an_idle_instance_that_dies_is_replaced_with_no_request(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, router = await serve(system, CONFIG, tmp_path)
    [first] = backend.instances
    first.die("the process exited with signal SIGKILL")
    await wait_health(owner, 2)
    assert owner.health == [
        (False, "instance 'm_0_0' failed: the process exited with signal SIGKILL"),
        (True, ""),
    ]
    assert len(backend.instances) == 2
    assert backend.finalized == [1]  # the dead one's resources went at once
    assert backend.executed == []  # nothing had to meet the dead instance
    with anyio.fail_after(WAIT):
        response = await router.infer(request(CONFIG))
    assert response.model_version == "2"


async def test_a_batch_the_dead_instance_never_ran_runs_on_the_replacement(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, router = await serve(system, CONFIG, tmp_path)
    # Dead, but not reported yet: the scheduler still hands it the next batch.
    backend.instances[0].die("the process exited with code 1", report=False)
    with anyio.fail_after(WAIT):
        response = await router.infer(request(CONFIG))
    assert response.model_version == "2"
    assert backend.executed == [2]
    await wait_health(owner, 2)
    assert [ready for ready, _ in owner.health] == [False, True]


async def test_where_the_scheduler_cannot_take_it_back_it_fails_with_the_reason(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, router = await serve(system, ORDERED, tmp_path)
    backend.instances[0].die("the process exited with code 1", report=False)
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await router.infer(request(ORDERED))
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert caught.value.message == "the process exited with code 1"
    await wait_health(owner, 2)
    with anyio.fail_after(WAIT):
        response = await router.infer(request(ORDERED))
    assert response.model_version == "2"


TWO = CONFIG.replace("count: 1", "count: 2")


@pytest.fixture
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts with no wait between them: the tests wait on what happens, not on the clock."""
    monkeypatch.setattr(ModelVersionActor, "RESTART_DELAYS", (0.0, 0.0, 0.0))
    monkeypatch.setattr(ModelVersionActor, "RESTART_DELAY_CAP", 0.0)


async def until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not check():
            await anyio.sleep(0.001)


def test_restarts_back_off_to_a_cap() -> None:
    version = ModelVersionActor.__new__(ModelVersionActor)
    assert [version.restart_delay(n) for n in range(9)] == [0, 0.5, 2, 4, 8, 16, 30, 30, 30]


@pytest.mark.usefixtures("quick_restarts")
async def test_an_instance_that_cannot_restart_does_not_take_its_healthy_sibling_down(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, router = await serve(system, TWO, tmp_path)
    first, second = backend.instances
    backend.refuse = True
    first.die("the process exited with signal SIGKILL")
    # Far more failed attempts than the first three: it keeps being tried...
    await until(lambda: len(backend.refused) >= 10)
    assert set(backend.refused) == {"m_0_0"}
    # ...while the version serves on its other instance, and stays loaded.
    with anyio.fail_after(WAIT):
        response = await router.infer(request(TWO))
    assert response.model_version == str(second.generation)
    assert owner.failed == []
    # It serves: it never stopped being ready (the death is logged, not reported as health).
    assert owner.health == []
    backend.refuse = False  # it can start again: replaced, and the version is whole again
    await until(lambda: len(backend.instances) == 3)
    assert owner.health == [] and owner.failed == []


@pytest.mark.usefixtures("quick_restarts")
async def test_the_last_instance_down_makes_the_version_unavailable_until_one_serves(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, _ = await serve(system, TWO, tmp_path)
    first, second = backend.instances
    first.die("the process exited with code 1")
    await until(lambda: len(backend.instances) == 3)  # replaced; health never changed
    assert owner.health == []
    backend.refuse = True
    second.die("the process exited with signal SIGKILL")
    third = backend.instances[2]
    third.die("the process exited with signal SIGKILL")  # none left: unavailable
    await wait_health(owner, 1)
    assert (
        owner.health == [(False, "instance 'm_0_0' failed: the process exited with signal SIGKILL")]
        or owner.health[0][0] is False
    )
    backend.refuse = False
    await wait_health(owner, 2)
    assert owner.health[-1] == (True, "")


async def test_a_replacement_that_dies_soon_backs_off_as_a_failed_start(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    delay = ModelVersionActor.restart_delay

    def recorded(self: ModelVersionActor, attempts: int) -> float:
        asked.append(attempts)
        return delay(self, attempts)

    monkeypatch.setattr(ModelVersionActor, "restart_delay", recorded)
    backend, _, _ = await serve(system, CONFIG, tmp_path)
    backend.instances[0].die("the process exited with code 1")
    await until(lambda: len(backend.instances) == 2)  # replaced at once (attempt 0)
    backend.instances[1].die("the process exited with code 1")  # and it dies at once too
    await until(lambda: len(asked) == 2)
    # The second death counts as a failed attempt: its replacement waits, rather than
    # starting at once, again and again.
    assert asked == [0, 1]
    assert ModelVersionActor.RESTART_DELAYS[1] > 0


@pytest.mark.usefixtures("quick_restarts")
async def test_requests_queued_when_the_version_gives_up_are_told_why(
    system: ActorSystem, tmp_path: Path
) -> None:
    """Not that the model is unloading (nobody asked): that it failed, and why."""
    backend, _, router = await serve(system, CONFIG, tmp_path)
    backend.refuse = True
    backend.instances[0].die("the process exited with code 1")
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await router.infer(request(CONFIG))  # queued: no instance serves
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.message == (
        "model 'm' failed (instance 'm_0_0' failed: the process exited with code 1; "
        "restarting it failed: no weights); the request was not run"
    )


@pytest.mark.usefixtures("quick_restarts")
async def test_the_version_fails_when_no_instance_is_left_after_the_first_attempts(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend, owner, _ = await serve(system, CONFIG, tmp_path)
    backend.refuse = True
    backend.instances[0].die("the process exited with code 1")
    await until(lambda: bool(owner.failed))
    assert backend.refused == ["m_0_0"] * len(ModelVersionActor.RESTART_DELAYS)
    assert owner.failed == [
        "instance 'm_0_0' failed: the process exited with code 1; restarting it failed: no weights"
    ]
