"""Helpers for the tests that drive the python backend directly: models from tests/python_models
loaded through `PythonBackend`, requests built by hand, and decoupled answers collected from the
stub's threads."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np

from tritonactor.backends.base import InstanceContext, ModelContext
from tritonactor.backends.python import PythonBackend, PythonInstance
from tritonactor.config.model_config import read_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.datatypes import from_numpy_dtype
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender, Tensor

MODELS = Path(__file__).resolve().parent / "python_models"
# How long a test waits for something the model does on its own threads: generous, as the
# machine may be busy; reaching it is a failure, never an expected outcome.
PATIENCE_S = 60.0


def context(name: str, repository: Path = MODELS) -> ModelContext:
    model_dir = repository / name
    config = fill_defaults(read_pbtxt(model_dir / "config.pbtxt"), gpus=0)
    return ModelContext(
        name=name,
        version=1,
        config=config,
        model_dir=model_dir,
        version_dir=model_dir / "1",
        model_path=model_dir / "1" / "model.py",
    )


class Started:
    """Instances started by a test, finalized when it ends."""

    def __init__(self, backend: PythonBackend) -> None:
        self.backend = backend
        self.instances: list[PythonInstance] = []

    def __call__(
        self,
        name: str,
        infer: Any = None,
        index: int = 0,
        model_context: ModelContext | None = None,
        submit: Any = None,
        control: Any = None,
    ) -> PythonInstance:
        model = self.backend.load_model(model_context or context(name))
        instance = model.create_instance(
            InstanceContext(
                f"{name}_0_{index}",
                "KIND_CPU",
                0,
                index,
                infer=infer,
                submit=submit,
                control=control,
            )
        )
        self.instances.append(instance)
        return instance

    def finalize_all(self) -> None:
        for instance in self.instances:
            instance.finalize()


def tensor(name: str, data: np.ndarray) -> Tensor:
    datatype = "BYTES" if data.dtype == np.object_ else from_numpy_dtype(data.dtype)
    return Tensor(name=name, datatype=datatype, shape=tuple(data.shape), data=data)


def text(name: str, value: str) -> Tensor:
    return tensor(name, np.array([value.encode()], dtype=np.object_))


def int32(name: str, value: int) -> Tensor:
    return tensor(name, np.array([value], dtype=np.int32))


def request(model: str, *inputs: Tensor, **kwargs: Any) -> InferenceRequest:
    return InferenceRequest(model_name=model, inputs=list(inputs), **kwargs)


def outputs(result: object) -> dict[str, np.ndarray]:
    assert isinstance(result, InferenceResponse), result
    return {t.name: t.data for t in result.outputs}


class Answers:
    """A decoupled request's answers, as the stub's threads deliver them:
    (response, error, final) tuples in a queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[InferenceResponse | None, TritonError | None, bool]] = (
            queue.Queue()
        )
        self.sender = ResponseSender(lambda *answer: self.queue.put(answer))

    def next(self) -> tuple[InferenceResponse | None, TritonError | None, bool]:
        return self.queue.get(timeout=PATIENCE_S)

    def until_final(self) -> list[tuple[InferenceResponse | None, TritonError | None, bool]]:
        answers = [self.next()]
        while not answers[-1][2]:
            answers.append(self.next())
        return answers


def decoupled(model: str, *inputs: Tensor, **kwargs: Any) -> tuple[InferenceRequest, Answers]:
    answers = Answers()
    return request(model, *inputs, sender=answers.sender, **kwargs), answers
