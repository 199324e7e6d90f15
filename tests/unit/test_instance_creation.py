"""An instance created on a worker thread whose caller gave up (scheduling/model.py
`_Creation`): the backend is told to cut the creation short, and an instance that comes up
anyway is finalized, not left running with nobody to stop it."""

from __future__ import annotations

import threading

from tritonactor.backends.base import BackendInstance, BackendModel, InstanceContext, Result
from tritonactor.core.types import InferenceRequest
from tritonactor.scheduling.model import _Creation

CONTEXT = InstanceContext("m_0", "KIND_CPU", 0, 0)


class Instance(BackendInstance):
    def __init__(self) -> None:
        self.finalized = threading.Event()

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        return []

    def finalize(self) -> None:
        self.finalized.set()


class GatedModel(BackendModel):
    """`create_instance` waits for `go` (a model's `initialize` taking its time)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.aborted: list[str] = []
        self.made: list[Instance] = []

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        self.entered.set()
        assert self.go.wait(30)
        self.made.append(Instance())
        return self.made[-1]

    def abort_create(self, context: InstanceContext) -> None:
        self.aborted.append(context.name)


def test_an_instance_that_comes_up_after_its_creation_was_abandoned_is_finalized() -> None:
    model = GatedModel()
    creation = _Creation(model, CONTEXT)
    raised: list[BaseException] = []

    def create() -> None:
        try:
            creation.run()
        except RuntimeError as error:
            raised.append(error)

    worker = threading.Thread(target=create)
    worker.start()
    assert model.entered.wait(30)
    assert creation.abandon() is None
    assert model.aborted == ["m_0"]  # told to cut it short
    model.go.set()  # it comes up all the same
    worker.join(30)
    assert model.made[0].finalized.is_set() and raised


def test_an_instance_made_as_its_creation_is_abandoned_is_handed_back() -> None:
    model = GatedModel()
    model.go.set()
    creation = _Creation(model, CONTEXT)
    made = creation.run()  # (its result on its way to a caller that gave up)
    assert creation.abandon() is made
    assert model.aborted == []  # nothing to cut short
    assert not model.made[0].finalized.is_set()  # the caller's to finalize


def test_a_creation_not_abandoned_returns_its_instance() -> None:
    model = GatedModel()
    model.go.set()
    instance = _Creation(model, CONTEXT).run()
    assert not model.made[0].finalized.is_set() and instance is model.made[0]
