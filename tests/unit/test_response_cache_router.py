"""The router with a response cache, in-process over a real model-version actor (the echo model
of test_scheduling): a hit never reaches the scheduler and counts as Triton 2.51 counts one;
errors are never stored; a version's entries go with it."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import numpy as np
import pytest

import tritonactor.scheduling.caching as caching_module
from tests.unit.test_scheduling import CONFIG, EchoBackend, context, request
from tritonactor._proto.inference import (
    ModelConfig,
    ModelEnsembling,
    ModelEnsemblingStep,
    ModelResponseCache,
)
from tritonactor.actors import ActorSystem
from tritonactor.backends.base import ModelContext
from tritonactor.cache import ResponseCache
from tritonactor.cache.key import content_digest
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core import offload
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

T = TypeVar("T")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(
    system: ActorSystem,
    router: Router,
    backend: EchoBackend,
    cached: bool = True,
    count: int = 1,
) -> ModelHandle:
    """Spawn a version of the echo model and add it to `router`."""
    ctx = context(count)
    if cached:
        ctx.config.response_cache = ModelResponseCache(enable=True)
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    signature = ModelSignature.from_config(ctx.config)
    handle = ModelHandle("echo", 1, ctx.config, signature, actor.scheduler, actor.statistics)
    router.known.add("echo")
    router.add(handle)
    return handle


def counts(handle: ModelHandle) -> dict[str, int]:
    stats = handle.statistics
    return {
        "success": stats.success.count,
        "fail": stats.fail.count,
        "queue": stats.queue.count,
        "compute_infer": stats.compute_infer.count,
        "cache_hit": stats.cache_hit.count,
        "cache_miss": stats.cache_miss.count,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
    }


async def test_a_hit_is_answered_without_the_model_and_counted_as_triton_does(
    system: ActorSystem,
) -> None:
    backend = EchoBackend()
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, backend)
    first = await router.infer(request(3, "a"))
    second = await router.infer(request(3, "b"))
    assert len(backend.executed_by) == 1  # the second never reached an instance
    assert second.id == "b" and second.model_name == "echo" and second.model_version == "1"
    np.testing.assert_array_equal(second.outputs[0].data, first.outputs[0].data)
    # Triton 2.51 after a miss and a hit: success 2, queue 2, compute 1, cache_hit 1,
    # cache_miss 1, one inference in one execution.
    assert counts(handle) == {
        "success": 2,
        "fail": 0,
        "queue": 2,
        "compute_infer": 1,
        "cache_hit": 1,
        "cache_miss": 1,
        "inference_count": 1,
        "execution_count": 1,
    }
    stats = handle.statistics
    assert stats.cache_hit.ns > 0 and stats.cache_miss.ns > 0
    assert stats.pending == 0
    assert router.cache is not None and router.cache.sample().hits == 1


async def test_submit_answers_a_hit_at_once(system: ActorSystem) -> None:
    backend = EchoBackend()
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, backend)
    await router.submit(request(5)).wait()
    reply = router.submit(request(5, "again"))
    assert reply.done
    response = reply.result()
    assert isinstance(response, InferenceResponse) and response.id == "again"
    assert len(backend.executed_by) == 1
    assert counts(handle)["cache_hit"] == 1


async def test_errors_are_never_cached(system: ActorSystem) -> None:
    backend = EchoBackend()
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, backend)
    for _ in range(2):
        with pytest.raises(TritonError, match="negative input"):
            await router.infer(request(-1))
    assert router.cache is not None and len(router.cache) == 0
    assert counts(handle)["fail"] == 2
    assert counts(handle)["cache_hit"] == counts(handle)["cache_miss"] == 0


async def test_a_model_that_does_not_ask_for_the_cache_never_uses_it(system: ActorSystem) -> None:
    backend = EchoBackend()
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, backend, cached=False)
    await router.infer(request(1))
    await router.infer(request(1))
    assert len(backend.executed_by) == 2
    assert router.cache is not None and router.cache.sample().lookups == 0
    assert handle.statistics.sample("echo", 1).cache is None


async def test_without_a_server_cache_a_model_asking_for_it_runs_every_request(
    system: ActorSystem,
) -> None:
    backend = EchoBackend()
    router = Router()
    handle = await serve(system, router, backend)
    await router.infer(request(1))
    await router.infer(request(1))
    assert len(backend.executed_by) == 2
    assert counts(handle)["cache_miss"] == 0
    # As Triton: the per-model cache families still exist for it (all zero).
    sample = handle.statistics.sample("echo", 1, response_cache=True)
    assert sample.cache is not None and sample.cache.hits == sample.cache.misses == 0


async def test_twins_in_flight_both_run_and_the_second_counts_neither(
    system: ActorSystem,
) -> None:
    # Two instances held at a barrier: both requests are executing at once, so both missed.
    backend = EchoBackend(barrier=threading.Barrier(2))
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, backend, count=2)
    results: list[InferenceResponse] = []

    async def send(request_id: str) -> None:
        results.append(await router.infer(request(7, request_id)))

    async with anyio.create_task_group() as group:
        group.start_soon(send, "x")
        group.start_soon(send, "y")
    assert len(backend.executed_by) == 2
    # The first answer was stored (a miss); the second found it there: neither, as in Triton.
    assert counts(handle)["cache_miss"] == 1 and counts(handle)["cache_hit"] == 0
    assert counts(handle)["success"] == 2
    assert router.cache is not None and len(router.cache) == 1


async def test_a_version_leaving_or_replaced_takes_its_entries(system: ActorSystem) -> None:
    backend = EchoBackend()
    cache = ResponseCache(1 << 20)
    router = Router(cache)
    first = await serve(system, router, backend)
    await router.infer(request(2))
    assert len(cache) == 1
    second = await serve(system, router, backend)  # a reload: another copy of version 1
    assert len(cache) == 0
    await router.infer(request(2))
    assert len(backend.executed_by) == 2 and len(cache) == 1
    router.remove("echo", 1)
    assert len(cache) == 0
    assert first is not second


async def test_a_retired_copy_does_not_store_its_late_answers(system: ActorSystem) -> None:
    gate = threading.Barrier(2)  # holds the old copy's execute until the test lets it go
    cache = ResponseCache(1 << 20)
    router = Router(cache)
    old = await serve(system, router, EchoBackend(barrier=gate))
    reply = router.submit(request(4))  # executing on the old copy, held at the gate
    await serve(system, router, EchoBackend())  # replaced meanwhile
    await anyio.to_thread.run_sync(gate.wait)
    await reply.wait()
    assert len(cache) == 0
    # It did miss: counted on the copy that answered it.
    assert counts(old)["cache_miss"] == 1


async def test_an_unknown_model_or_a_bad_request_never_reaches_the_cache(
    system: ActorSystem,
) -> None:
    router = Router(ResponseCache(1 << 20))
    await serve(system, router, EchoBackend())
    bad = request(1)
    bad.inputs[0].datatype = "FP32"
    with pytest.raises(TritonError):
        await router.infer(bad)
    assert router.cache is not None and router.cache.sample().lookups == 0


async def test_an_answer_too_large_for_the_cache_is_a_logged_miss(
    system: ActorSystem, caplog: pytest.LogCaptureFixture
) -> None:
    # The smallest cache has 64 bytes for entries; the echo answer takes 80.
    backend = EchoBackend()
    router = Router(ResponseCache(192))
    handle = await serve(system, router, backend)
    for _ in range(2):
        await router.infer(request(1))
    assert len(backend.executed_by) == 2
    assert counts(handle)["cache_miss"] == 2  # as Triton: a failed insertion is still a miss
    assert router.cache is not None and len(router.cache) == 0
    assert "Failed to insert key into response cache" in caplog.text
    assert "model 'echo' version 1 takes 64 bytes" in caplog.text


# -- review findings: never copied when it cannot fit, ensembles, off the event loop -------------


async def serve_wide(system: ActorSystem, router: Router) -> ModelHandle:
    """The echo model with inputs of any length (dims [-1]), asking for the cache."""
    config = fill_defaults(parse_pbtxt(CONFIG.replace("[ 2 ]", "[ -1 ]") % 1), gpus=0)
    config.response_cache = ModelResponseCache(enable=True)
    ctx = ModelContext("echo", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(EchoBackend(), ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    signature = ModelSignature.from_config(config)
    handle = ModelHandle("echo", 1, config, signature, actor.scheduler, actor.statistics)
    router.known.add("echo")
    router.add(handle)
    return handle


def wide(values: int, request_id: str = "") -> InferenceRequest:
    data = np.arange(values, dtype=np.int32).reshape(1, values)
    return InferenceRequest("echo", id=request_id, inputs=[Tensor("IN", "INT32", data.shape, data)])


async def test_an_answer_larger_than_the_cache_is_never_copied(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed: list[int] = []
    real_pack = caching_module.pack

    def counting(response: InferenceResponse) -> bytes:
        blob = real_pack(response)
        packed.append(len(blob))
        return blob

    monkeypatch.setattr(caching_module, "pack", counting)
    router = Router(ResponseCache(1024))
    handle = await serve_wide(system, router)
    await router.infer(wide(1000))  # 4000 bytes of output: more than the whole cache
    assert packed == [] and counts(handle)["cache_miss"] == 1
    await router.infer(wide(4))  # one that fits is copied and stored
    assert len(packed) == 1 and router.cache is not None and len(router.cache) == 1


def ensemble(name: str, step: str) -> ModelHandle:
    config = ModelConfig(
        name=name,
        platform="ensemble",
        ensemble_scheduling=ModelEnsembling(step=[ModelEnsemblingStep(model_name=step)]),
        response_cache=ModelResponseCache(enable=True),
    )
    return ModelHandle(name, 1, config, ModelSignature.from_config(config), None)  # type: ignore[arg-type]


async def test_a_step_model_changing_drops_its_ensembles_entries(system: ActorSystem) -> None:
    # inner runs echo; outer runs inner: a new copy or version of echo, or echo leaving, may
    # change what both answer.
    cache = ResponseCache(1 << 20)
    router = Router(cache)
    await serve(system, router, EchoBackend())
    router.add(ensemble("inner", "echo"))
    router.add(ensemble("outer", "inner"))
    router.add(ensemble("other", "elsewhere"))

    def fill() -> None:
        blob = caching_module.pack(InferenceResponse("m", "1"))
        for owner in ("echo", "inner", "outer", "other"):
            cache.insert(owner.encode(), (owner, 1), blob)

    fill()
    await serve(system, router, EchoBackend())  # echo 1 reloaded
    assert sorted(key.decode() for key in cache._entries) == ["other"]
    fill()
    router.remove("echo", 1)
    assert sorted(key.decode() for key in cache._entries) == ["other"]
    fill()
    router.add(ensemble("inner", "echo"))  # an ensemble reloaded: its own and its dependents'
    assert sorted(key.decode() for key in cache._entries) == ["echo", "other"]


@pytest.mark.parametrize("off_loop", [True, False])
async def test_the_cache_works_off_the_event_loop_when_it_is_large(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch, off_loop: bool
) -> None:
    # The key, the copy into the cache and the answer of a hit: on a worker thread for large
    # requests (here every one, the threshold lowered to 1 byte), on the loop otherwise.
    if off_loop:
        monkeypatch.setattr(offload, "OFF_LOOP_BYTES", 1)
    threads: dict[str, list[bool]] = {"key": [], "pack": [], "unpack": []}

    def recording(name: str, work: Callable[..., T]) -> Callable[..., T]:
        def run(*args: object) -> T:
            threads[name].append(threading.current_thread() is not threading.main_thread())
            return work(*args)

        return run

    monkeypatch.setattr(caching_module, "content_digest", recording("key", content_digest))
    monkeypatch.setattr(caching_module, "pack", recording("pack", caching_module.pack))
    monkeypatch.setattr(caching_module, "unpack", recording("unpack", caching_module.unpack))
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, EchoBackend())
    first = await router.infer(request(6, "a"))
    second = await router.infer(request(6, "b"))
    third = request(6, "c")
    await router.prepare(third)  # the gRPC stream's pre-step, then submit
    streamed = await router.submit(third).wait()
    assert counts(handle)["cache_hit"] == 2 and counts(handle)["cache_miss"] == 1
    for answer in (second, streamed):
        np.testing.assert_array_equal(answer.outputs[0].data, first.outputs[0].data)
    assert (second.id, streamed.id) == ("b", "c")
    if off_loop:
        assert threads == {"key": [True, True, True], "pack": [True], "unpack": [True, True]}
    else:
        # Small: the key is worked out where it is needed (request_key), all on the loop.
        assert threads == {"key": [], "pack": [False], "unpack": [False, False]}


async def test_submit_answers_once_a_large_answer_is_stored_so_a_twin_sent_then_hits(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the engine's connection to a front end and a gRPC stream answer through: the answer
    # comes after its copy into the cache (off the loop here), as `infer`'s does.
    monkeypatch.setattr(offload, "OFF_LOOP_BYTES", 1)
    router = Router(ResponseCache(1 << 20))
    handle = await serve(system, router, EchoBackend())
    first = request(6, "a")
    answered = router.submit(first)
    stored_when_answered: list[bool] = []
    answered.add_done_callback(
        lambda _: stored_when_answered.append(first.context[caching_module.STORING].done())
    )
    await answered.wait()
    assert stored_when_answered == [True]
    twin = await router.submit(request(6, "b")).wait()
    assert (counts(handle)["cache_hit"], counts(handle)["execution_count"]) == (1, 1)
    assert twin.id == "b"


async def test_an_answer_looked_up_before_its_entries_were_dropped_is_not_stored(
    system: ActorSystem,
) -> None:
    # A request in flight while its version's entries are dropped (an ensemble whose step
    # changed meanwhile): its answer may be the old one, so it is not stored.
    gate = threading.Barrier(2)  # holds the execute until the test lets it go
    cache = ResponseCache(1 << 20)
    router = Router(cache)
    handle = await serve(system, router, EchoBackend(barrier=gate))
    reply = router.submit(request(8))
    assert cache.drop("echo", 1) == 0  # what a changed step does to its ensembles' versions
    await anyio.to_thread.run_sync(gate.wait)
    await reply.wait()
    assert len(cache) == 0
    assert counts(handle)["cache_miss"] == 1  # it did miss
    again = router.submit(request(8))  # looked up after the drop: stored
    await anyio.to_thread.run_sync(gate.wait)
    await again.wait()
    assert len(cache) == 1


async def test_what_a_front_end_adds_to_a_large_answer_never_reaches_the_cache(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large answer is packed on a worker thread after the reply's callbacks ran: a gRPC
    # stream marking the response final then must not see its mark in later hits.
    monkeypatch.setattr(offload, "OFF_LOOP_BYTES", 1)
    router = Router(ResponseCache(1 << 20))
    await serve(system, router, EchoBackend())
    first = request(9, "a")
    reply = router.submit(first)
    reply.add_done_callback(lambda done: done.result().parameters.update(front_end_mark=True))
    await reply.wait()
    storing = first.context[caching_module.STORING]
    await storing
    hit = await router.infer(request(9, "b"))
    assert "front_end_mark" not in hit.parameters


async def test_prepare_never_hashes_a_request_that_is_not_valid(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "OFF_LOOP_BYTES", 1)
    hashed: list[InferenceRequest] = []
    monkeypatch.setattr(caching_module, "content_digest", hashed.append)
    router = Router(ResponseCache(1 << 20))
    await serve(system, router, EchoBackend())
    bad = request(1)
    bad.inputs[0].datatype = "FP32"
    await router.prepare(bad)
    assert hashed == []
    good = request(1)
    await router.prepare(good)
    assert hashed == [good]
