"""An input in system shared memory reaches the backend's `execute` as the client's memory, not
a copy: decoded by each wire codec with a real lease, routed, scheduled (the default scheduler
and the dynamic batcher with a batch of one) and executed by an in-process instance that keeps
the arrays it was given. A later write by the client shows in them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.utils.shared_memory as client_shm

from tritonactor._proto.inference import (
    InferParameter,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
)
from tritonactor.actors import ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.grpc import codec as grpc_codec
from tritonactor.frontends.http import codec as http_codec
from tritonactor.memory.lease import Lease
from tritonactor.memory.registry import SharedMemoryRegistry
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

CONFIG = """
name: "keeper"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}
"""


class KeepingInstance(BackendInstance):
    """Keeps every input array it is given; answers OUT = [0]."""

    def __init__(self, kept: list[np.ndarray]) -> None:
        self.kept = kept

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            self.kept.append(request.inputs[0].data)
            out = np.zeros((*request.inputs[0].shape[:-1], 1), dtype=np.int32)
            results.append(
                InferenceResponse("keeper", "1", outputs=[Tensor("OUT", "INT32", out.shape, out)])
            )
        return results


class KeepingModel(BackendModel):
    def __init__(self, kept: list[np.ndarray]) -> None:
        self.kept = kept

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return KeepingInstance(self.kept)


class KeepingBackend(Backend):
    name = "keeping"

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return KeepingModel(self.kept)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


@pytest.fixture
def region() -> Iterator[tuple[SharedMemoryRegistry, Any]]:
    """A registry with region "r" (64 bytes of a client's object) and the client's handle."""
    key = f"/tritonactor_path_{uuid.uuid4().hex[:12]}"
    handle = client_shm.create_shared_memory_region("path", key, 64)
    registry = SharedMemoryRegistry()
    registry.register_system("r", key, 0, 64)
    yield registry, handle
    registry.close()
    client_shm.destroy_shared_memory_region(handle)


def http_request(lease: Lease, shape: list[int]) -> InferenceRequest:
    size = 4 * int(np.prod(shape))
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "IN",
                    "datatype": "INT32",
                    "shape": shape,
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": size},
                }
            ]
        }
    )
    return http_codec.decode_infer_request(
        body, None, "keeper", "", shared_memory=lease.read, shared_memory_outputs=lease.reserve
    )


def grpc_request(lease: Lease, shape: list[int]) -> InferenceRequest:
    size = 4 * int(np.prod(shape))
    parameters = {
        "shared_memory_region": InferParameter(string_param="r"),
        "shared_memory_byte_size": InferParameter(int64_param=size),
    }
    message = ModelInferRequest(
        model_name="keeper",
        inputs=[
            ModelInferRequestInferInputTensor(
                name="IN", datatype="INT32", shape=shape, parameters=parameters
            )
        ],
    )
    return grpc_codec.decode_infer_request(
        message, shared_memory=lease.read, shared_memory_outputs=lease.reserve
    )


async def serve(system: ActorSystem, backend: KeepingBackend, batching: bool) -> Router:
    text = CONFIG.format(
        max_batch_size=4 if batching else 0, batching="dynamic_batching { }" if batching else ""
    )
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    context = ModelContext("keeper", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, context)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("keeper")
    router.add(
        ModelHandle("keeper", 1, config, ModelSignature.from_config(config), actor.scheduler)
    )
    return router


@pytest.mark.parametrize("batching", [False, True], ids=["default", "dynamic"])
@pytest.mark.parametrize("decode", [http_request, grpc_request], ids=["http", "grpc"])
async def test_the_backend_is_given_the_clients_memory(
    system: ActorSystem,
    region: tuple[SharedMemoryRegistry, Any],
    decode: Callable[[Lease, list[int]], InferenceRequest],
    batching: bool,
) -> None:
    registry, handle = region
    client_shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int32)])
    backend = KeepingBackend()
    router = await serve(system, backend, batching)
    lease = Lease(registry)

    await router.infer(decode(lease, [1, 4] if batching else [4]))
    lease.release()

    (given,) = backend.kept
    assert given.ravel().tolist() == [0, 1, 2, 3]
    # The client writes again: what the backend was given sees it, so it is no copy.
    client_shm.set_shared_memory_region(handle, [np.array([7], dtype=np.int32)])
    assert given.ravel().tolist() == [7, 1, 2, 3]
    assert not given.flags.writeable
