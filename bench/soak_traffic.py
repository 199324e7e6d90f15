"""The soak's traffic (bench/soak.py): clients of four kinds sending requests back to back,
and how each request ended (ok, failed, lost, refused), with the fault it overlapped."""

from __future__ import annotations

import contextlib
import json
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

REQUEST_TIMEOUT = 30.0  # seconds without an answer: lost
GRACE = 3.0  # seconds after a fault ends that still count against it


class Target(Protocol):
    """Where the traffic goes (the soak's server, across its restarts)."""

    @property
    def base(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...


# --- outcomes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # the traffic: http infer, grpc infer, grpc stream, http stream
    start: float
    end: float
    result: str  # ok, failed, lost, refused
    detail: str = ""


@dataclass
class Ledger:
    outcomes: list[Outcome] = field(default_factory=list)
    faults: list[tuple[str, float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def fault(self, name: str, start: float, end: float) -> None:
        with self.lock:
            self.faults.append((name, start, end))

    def blame(self, outcome: Outcome) -> str | None:
        """The fault whose window the request overlaps, if any ("..., sent after" when the
        request was sent once the fault was over: the server should have served it)."""
        for name, start, end in self.faults:
            if outcome.start <= end + GRACE and outcome.end >= start:
                return f"{name}, sent after" if outcome.start > end else name
        return None


def classify(error: BaseException) -> str:
    """failed (the server answered an error), lost (sent, no answer) or refused (not sent)."""
    text = str(error)
    if isinstance(error, requests.ConnectionError):
        if "refused" in text:
            return "refused"
        return "lost"  # reset, closed, or "Server disconnected" after the request went out
    if isinstance(error, requests.Timeout | requests.exceptions.ChunkedEncodingError):
        return "lost"  # no answer in time, or the answer cut short
    if isinstance(error, StreamTimeout):
        return "lost"
    if isinstance(error, InferenceServerException):
        if "no longer in valid state" in text:
            return "refused"  # the client would not send it on a stream that had failed
        status = error.status() or ""
        if "DEADLINE_EXCEEDED" in status:
            return "lost"
        if "UNAVAILABLE" in status:
            lowered = text.lower()
            if "failed to connect" in lowered or "connection refused" in lowered:
                return "refused"
            if any(w in lowered for w in ("socket closed", "stream removed", "connection reset")):
                return "lost"
        return "failed"
    return "failed"


# --- traffic -----------------------------------------------------------------------------------


class Traffic:
    def __init__(self, server: Target, ledger: Ledger, stop: threading.Event) -> None:
        self.server = server
        self.ledger = ledger
        self.stop = stop

    def run(self, kind: str, once: Any) -> None:
        """Call `once()` back to back until stopped, recording each outcome."""
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                once()
                result, detail = "ok", ""
            except Exception as error:  # every way a request can end is an outcome
                result, detail = classify(error), f"{type(error).__name__}: {error}"[:300]
            end = time.monotonic()
            self.ledger.add(Outcome(kind, start, end, result, detail))
            if result == "refused":
                self.stop.wait(0.2)  # the server is away: do not spin
            elif result != "ok":
                self.stop.wait(0.05)  # as a client would, before it tries again

    def http_infer(self) -> None:
        session = requests.Session()
        rng = random.Random(1)

        def once() -> None:
            if rng.random() < 0.5:
                data = [rng.random() for _ in range(rng.randint(1, 64))]
                body = {"inputs": [{"name": "INPUT0", "shape": [len(data)], "datatype": "FP32",
                                    "data": data}]}  # fmt: skip
                model, expect = "identity", np.asarray(data, dtype=np.float32)
            else:
                values = [rng.randint(-100, 100) for _ in range(16)]
                body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32",
                                    "data": values} for n in ("INPUT0", "INPUT1")]}  # fmt: skip
                model, expect = "simple", np.asarray(values, dtype=np.int32) * 2
            answer = session.post(
                f"{self.server.base}/v2/models/{model}/infer", json=body, timeout=REQUEST_TIMEOUT
            )
            if answer.status_code != 200:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
            got = np.asarray(answer.json()["outputs"][0]["data"], dtype=expect.dtype)
            if not np.array_equal(got.reshape(-1), expect.reshape(-1)):
                raise RuntimeError(f"{model}: wrong answer")

        self.run("http infer", once)

    def _grpc(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.server.grpc_url)

    def grpc_infer(self) -> None:
        rng = random.Random(2)
        client = self._grpc()

        def once() -> None:
            if rng.random() < 0.5:
                data = np.random.default_rng(rng.randint(0, 1 << 30)).random(
                    rng.randint(1, 256), dtype=np.float32
                )
                tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                result = client.infer("identity", [tensor], client_timeout=REQUEST_TIMEOUT)
                ok = np.array_equal(result.as_numpy("OUTPUT0"), data)
            else:
                values = np.arange(16, dtype=np.int32).reshape(1, 16) * rng.randint(1, 9)
                tensors = []
                for name in ("INPUT0", "INPUT1"):
                    tensor = grpcclient.InferInput(name, [1, 16], "INT32")
                    tensor.set_data_from_numpy(values)
                    tensors.append(tensor)
                result = client.infer("simple", tensors, client_timeout=REQUEST_TIMEOUT)
                ok = np.array_equal(result.as_numpy("OUTPUT0"), values * 2)
            if not ok:
                raise RuntimeError("wrong answer")

        try:
            self.run("grpc infer", once)
        finally:
            client.close()

    def grpc_stream(self) -> None:
        rng = random.Random(3)
        answers: queue.Queue[Any] = queue.Queue()
        client = self._grpc()
        client.start_stream(
            callback=lambda result, error: answers.put(error if error is not None else result),
            stream_timeout=None,
        )
        streams = [client]

        def once() -> None:
            count = rng.randint(1, 6)
            tensor = grpcclient.InferInput("IN", [count], "INT32")
            tensor.set_data_from_numpy(np.arange(count, dtype=np.int32))
            try:
                streams[0].async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
                got = []
                while True:
                    try:
                        answer = answers.get(timeout=REQUEST_TIMEOUT)
                    except queue.Empty:
                        raise StreamTimeout("no answer on the stream") from None
                    if isinstance(answer, BaseException):
                        raise answer
                    response = answer.get_response()
                    if response.parameters["triton_final_response"].bool_param:
                        break
                    got.append(int(answer.as_numpy("OUT")[0]))
                if got != list(range(count)):
                    raise RuntimeError(f"stream answered {got}, not {list(range(count))}")
            except BaseException:
                # A stream that failed is over: the next request opens another.
                with contextlib.suppress(Exception):
                    streams[0].stop_stream(cancel_requests=True)
                    streams[0].close()
                while not answers.empty():
                    answers.get_nowait()
                fresh = self._grpc()
                fresh.start_stream(
                    callback=lambda result, error: answers.put(
                        error if error is not None else result
                    )
                )
                streams[0] = fresh
                raise

        try:
            self.run("grpc stream", once)
        finally:
            with contextlib.suppress(Exception):
                streams[0].stop_stream()
                streams[0].close()

    def http_stream(self) -> None:
        session = requests.Session()
        rng = random.Random(4)

        def once() -> None:
            count = rng.randint(1, 6)
            with session.post(
                f"{self.server.base}/v2/models/repeat/generate_stream",
                json={"IN": list(range(count))},
                stream=True,
                timeout=REQUEST_TIMEOUT,
            ) as answer:
                if answer.status_code != 200:
                    raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
                got = []
                for line in answer.iter_lines():
                    if line.startswith(b"data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            raise RuntimeError(f"stream error: {event['error']}")
                        got.append(event["OUT"])
            if got != list(range(count)):
                raise RuntimeError(f"stream answered {got}, not {list(range(count))}")

        self.run("http stream", once)


class StreamTimeout(Exception):
    """A stream's answer that never came: the request is lost."""
