"""What the python backend's process isolation costs: one identity model.py timed three ways.

    python bench/python_backend.py [--sizes 16,262144] [--seconds 1.5] [--levels 1,4]
        [--batches 1,8]

For each input size (an FP32 tensor of shape [1, N]) it times, in one run:

  (a) in-process: the model's `TritonPythonModel.execute`, imported into this process and called
      with `triton_python_backend_utils` requests built here, one request per call;
  (b) backend: `PythonBackend` -> `load_model` -> `create_instance` (on a worker thread of the
      loop, as the server does), then
      `await instance.execute(batch)` back to back on the event loop the engine process runs
      (uvloop; `--loop asyncio` for asyncio's own), for each batch size of --batches: the stub
      process hop and the /dev/shm transfer, with no HTTP, router or actors.
      Its round-trip CPU is split into the server's share (this process) and the stub's, per
      call (one batch) and per request, with the messages each call puts on the socket;
  (c) served: `perf_analyzer -i http` against one hypercorn worker serving the same model, at
      each concurrency level.

and prints µs per request, CPU µs per request (this process with its children for (a) and (b),
the server's process tree for (c)) and the ratio of each path's time per request to (a)'s.
The model repository (config.pbtxt and model.py) is written to a temporary folder by this script.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import numpy as np

from tritonactor.backends.base import InstanceContext, ModelContext
from tritonactor.backends.python import PythonBackend
from tritonactor.backends.python import triton_python_backend_utils as pb_utils
from tritonactor.config.model_config import config_to_json, read_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.types import InferenceRequest, RequestedOutput, Tensor

# http_infer.py beside this file already knows how to find perf_analyzer and measure CPU.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_infer import (
    MAX_TRIALS,
    RETRY_MAX_TRIALS,
    RETRY_STABILITY_PERCENT,
    STABILITY_PERCENT,
    http_floor,
    locate_perf_analyzer,
    machine_busy_seconds,
    machine_facts,
    run_perf_analyzer,
    self_cpu_seconds,
    start_server,
    stop_server,
    tree_cpu_seconds,
    usable_cpus,
)

MODEL_PY = '''\
"""Identity: OUTPUT0 is INPUT0, returned without a copy (written by bench/python_backend.py)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", data.astype(self.dtype, copy=False))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        pass
'''

CONFIG_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, {size} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, {size} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

# The first calls of (a) and (b) fill caches, map the shared-memory arenas and warm the stub.
WARMUP_CALLS = 200
WARMUP_SECONDS = 0.3


@dataclass(frozen=True)
class Timing:
    us_per_request: float  # wall time per request: 1e6 / throughput
    p50_us: float | None  # latency of one call (one request in flight; perf_analyzer's p50)
    cpu_us_per_request: float | None
    other_cores: float | None  # CPU the rest of the machine used meanwhile
    loose: bool = False  # (c) only: settled only within the retry's looser stability band
    # (b) only: the requests of one call, the round trip's CPU per call on each side, and the
    # messages one call sent to the stub and got back.
    batch: int = 1
    server_cpu_us_per_call: float | None = None
    stub_cpu_us_per_call: float | None = None
    messages_per_call: tuple[float, float] | None = None


@dataclass(frozen=True)
class SizeResult:
    elements: int
    in_process: Timing
    backend: list[Timing]
    served: dict[int, Timing | None]


# -- the temporary repository -------------------------------------------------------------------


def model_name(elements: int) -> str:
    return f"identity_fp32_{elements}"


def write_repository(root: Path, sizes: Sequence[int]) -> None:
    """One model per size (fixed dims, so perf_analyzer needs no --shape), same model.py."""
    for elements in sizes:
        name = model_name(elements)
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG_PBTXT.format(name=name, size=elements))
        (root / name / "1" / "model.py").write_text(MODEL_PY)


def model_context(root: Path, name: str) -> ModelContext:
    """What the server's loader builds for version 1 (config read and defaults filled)."""
    model_dir = root / name
    config = fill_defaults(read_pbtxt(model_dir / "config.pbtxt"), gpus=0)
    return ModelContext(
        name=name,
        version=1,
        config=config,
        model_dir=model_dir,
        version_dir=model_dir / "1",
        model_path=model_dir / "1" / "model.py",
    )


def initialize_args(context: ModelContext) -> dict[str, str]:
    return {
        "model_config": json.dumps(config_to_json(context.config)),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{context.name}_0_0",
        "model_instance_device_id": "0",
        "model_repository": str(context.model_dir),
        "model_version": "1",
        "model_name": context.name,
    }


# -- timing helpers -----------------------------------------------------------------------------


def _other_cores(
    busy_before: float | None, busy_after: float | None, ours: float, wall: float
) -> float | None:
    if busy_before is None or busy_after is None or wall <= 0:
        return None
    return max(0.0, busy_after - busy_before - ours) / wall


def _cpu_now() -> float:
    """CPU used so far by this process and its live children (the stub), from /proc."""
    tree = tree_cpu_seconds(os.getpid())
    return self_cpu_seconds() if tree is None else tree


# -- (a) in-process -----------------------------------------------------------------------------


def time_in_process(context: ModelContext, data: np.ndarray, seconds: float) -> Timing:
    """Import model.py here, as the stub does, and call execute with pb_utils requests."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    spec = importlib.util.spec_from_file_location(f"bench_model_{context.name}", context.model_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize(initialize_args(context))

    def call() -> None:
        request = pb_utils.InferenceRequest(
            model_name=context.name,
            inputs=[pb_utils.Tensor("INPUT0", data)],
            requested_output_names=["OUTPUT0"],
        )
        [response] = model.execute([request])
        assert response.output_tensors()[0].as_numpy().shape == data.shape

    for _ in range(WARMUP_CALLS):
        call()
    latencies: list[int] = []
    clock = time.perf_counter_ns
    busy_before, cpu_before = machine_busy_seconds(), self_cpu_seconds()
    began = clock()
    deadline = began + int(seconds * 1e9)
    end = began
    while end < deadline:
        start = clock()
        call()
        end = clock()
        latencies.append(end - start)
    wall = (end - began) / 1e9
    cpu = self_cpu_seconds() - cpu_before
    model.finalize()
    return _timing(latencies, wall, cpu, busy_before, machine_busy_seconds())


def _timing(
    latencies: list[int],
    wall: float,
    cpu: float,
    busy_before: float | None,
    busy_after: float | None,
    batch: int = 1,
) -> Timing:
    count = len(latencies) * batch
    return Timing(
        us_per_request=wall * 1e6 / count,
        p50_us=float(np.percentile(np.asarray(latencies), 50)) / 1000,
        cpu_us_per_request=cpu * 1e6 / count,
        other_cores=_other_cores(busy_before, busy_after, cpu, wall),
        batch=batch,
    )


# -- (b) the backend without HTTP ---------------------------------------------------------------


def _process_cpu(pid: int) -> float:
    """CPU (user + system) one process has used so far, from /proc."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_backend(
    context: ModelContext, data: np.ndarray, seconds: float, batch: int, loop: str = "uvloop"
) -> Timing:
    """One stub process; `await instance.execute(batch)` back to back on `loop`: uvloop, which
    the engine process runs its instances on (the engine of `tritonactor serve` and of
    `hypercorn tritonactor.app:app` alike), or asyncio's own, which the app runs on as one
    process under hypercorn (`--workers 0`, or on one core). The instance is made and finalized
    on a worker thread of that loop, as the server does (its reader then runs on the loop)."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_time_backend(context, data, seconds, batch))


async def _time_backend(
    context: ModelContext, data: np.ndarray, seconds: float, batch: int
) -> Timing:
    model = PythonBackend().load_model(context)
    instance = await anyio.to_thread.run_sync(
        model.create_instance, InstanceContext(f"{context.name}_0_0", "KIND_CPU", 0, 0)
    )
    # Count what crosses the process boundary: messages to the stub, and back from it.
    crossings = [0, 0]
    channel, dispatch = instance._stub.channel, instance._dispatch
    send = channel.send

    def counted_send(message: dict) -> None:
        crossings[0] += 1
        send(message)

    def counted_dispatch(message: dict) -> None:
        crossings[1] += 1
        dispatch(message)

    channel.send = counted_send  # type: ignore[method-assign]
    instance._dispatch = counted_dispatch  # type: ignore[method-assign]

    def request() -> InferenceRequest:
        return InferenceRequest(
            model_name=context.name,
            inputs=[Tensor(name="INPUT0", datatype="FP32", shape=data.shape, data=data)],
            outputs=[RequestedOutput("OUTPUT0")],
        )

    async def loop() -> Timing:
        async def call() -> None:
            for result in await instance.execute([request() for _ in range(batch)]):
                outputs = getattr(result, "outputs", None)
                if not outputs or outputs[0].data.shape != data.shape:
                    raise RuntimeError(f"unexpected result from the stub: {result!r}")

        warm_until = time.perf_counter() + WARMUP_SECONDS
        for count in range(10**9):
            await call()
            if count >= WARMUP_CALLS or time.perf_counter() > warm_until:
                break
        latencies: list[int] = []
        clock = time.perf_counter_ns
        busy_before, cpu_before = machine_busy_seconds(), _cpu_now()
        server_before, stub_before = self_cpu_seconds(), _process_cpu(instance.pid)
        crossings[:] = [0, 0]
        began = clock()
        deadline = began + int(seconds * 1e9)
        end = began
        while end < deadline:
            start = clock()
            await call()
            end = clock()
            latencies.append(end - start)
        wall = (end - began) / 1e9
        server, stub = self_cpu_seconds() - server_before, _process_cpu(instance.pid) - stub_before
        cpu = _cpu_now() - cpu_before
        calls = len(latencies)
        timing = _timing(latencies, wall, cpu, busy_before, machine_busy_seconds(), batch)
        return dataclasses.replace(
            timing,
            server_cpu_us_per_call=server * 1e6 / calls,
            stub_cpu_us_per_call=stub * 1e6 / calls,
            messages_per_call=(crossings[0] / calls, crossings[1] / calls),
        )

    try:
        return await loop()
    finally:
        await anyio.to_thread.run_sync(instance.finalize)


# -- (c) served over HTTP -----------------------------------------------------------------------


def time_served(
    perf_analyzer: str,
    name: str,
    url: str,
    level: int,
    duration_ms: int,
    workdir: Path,
    server_pid: int,
) -> Timing | None:
    # A level that does not settle within the usual band is measured again with a looser one,
    # as http_infer.py does (the 1 MiB rows at concurrency 1 often need it on 2 cores).
    loose = False
    for stability, trials in (
        (STABILITY_PERCENT, MAX_TRIALS),
        (RETRY_STABILITY_PERCENT, RETRY_MAX_TRIALS),
    ):
        measurement, load = run_perf_analyzer(
            perf_analyzer, name, url, level, duration_ms, workdir, stability, trials, server_pid
        )
        if measurement is not None:
            break
        loose = True
    if measurement is None:
        return None
    cpu = None
    if load.server_cores is not None:
        cpu = load.server_cores * 1e6 / measurement.infer_per_sec
    return Timing(
        us_per_request=1e6 / measurement.infer_per_sec,
        p50_us=measurement.p50_us,
        cpu_us_per_request=cpu,
        other_cores=load.other_cores,
        loose=loose,
    )


# -- report -------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(results: Sequence[SizeResult]) -> str:
    lines = [
        "| input | path | µs/request | infer/s | p50 µs | CPU µs/request | ratio to (a) "
        "| other cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        size = f"[1,{result.elements}] FP32 ({_bytes(result.elements * 4)})"
        base = result.in_process.us_per_request
        rows: list[tuple[str, Timing | None]] = [("(a) in-process execute", result.in_process)]
        rows += [(f"(b) backend: stub + shm, batch {t.batch}", t) for t in result.backend]
        rows += [(f"(c) HTTP, perf_analyzer c={n}", t) for n, t in result.served.items()]
        for label, timing in rows:
            if timing is None:
                lines.append(f"| {size} | {label} | failed | - | - | - | - | - |")
                continue
            digits = 1 if timing.us_per_request < 100 else 0
            cells = [
                size,
                label,
                _num(timing.us_per_request, digits) + ("*" if timing.loose else ""),
                _num(1e6 / timing.us_per_request),
                _num(timing.p50_us, digits),
                _num(timing.cpu_us_per_request, digits),
                f"{timing.us_per_request / base:,.1f}",
                _num(timing.other_cores, 2),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_round_trips(results: Sequence[SizeResult]) -> str:
    """(b)'s round trip: its CPU on each side of the process boundary, per call (one batch) and
    per request, and the messages one call crosses it with (to the stub / back)."""
    lines = [
        "| input | batch | server CPU µs/call | stub CPU µs/call | round trip CPU µs/call "
        "| µs/request | messages/call (out / back) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        size = f"[1,{result.elements}] FP32 ({_bytes(result.elements * 4)})"
        for t in result.backend:
            server, stub = t.server_cpu_us_per_call, t.stub_cpu_us_per_call
            total = None if server is None or stub is None else server + stub
            out, back = t.messages_per_call or (0.0, 0.0)
            cells = [
                size,
                str(t.batch),
                _num(server),
                _num(stub),
                _num(total),
                _num(None if total is None else total / t.batch),
                f"{out:.2f} / {back:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bytes(count: int) -> str:
    if count >= 1 << 20:
        return f"{count / (1 << 20):g} MiB"
    if count >= 1 << 10:
        return f"{count / (1 << 10):g} KiB"
    return f"{count} B"


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="16,262144", help="elements N of the [1, N] FP32 input, comma-separated"
    )
    parser.add_argument(
        "--seconds", type=float, default=1.5, help="timed loop of (a) and (b), per size"
    )
    parser.add_argument("--levels", default="1,4", help="perf_analyzer concurrencies")
    parser.add_argument("--batches", default="1,8", help="requests per call of (b)")
    parser.add_argument(
        "--duration-ms", type=int, default=1500, help="perf_analyzer measurement window"
    )
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary (default: install one)")
    parser.add_argument("--no-http", action="store_true", help="skip (c)")
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the event loop of (b): the engine's (uvloop) or asyncio's own",
    )
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the repository and logs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    levels = [int(n) for n in args.levels.split(",") if n.strip()]
    batches = [int(n) for n in args.batches.split(",") if n.strip()]
    if not sizes or min(sizes) < 1 or (levels and min(levels) < 1) or not batches:
        sys.exit("--sizes, --levels and --batches need positive integers")
    if min(batches) < 1:
        sys.exit("--sizes, --levels and --batches need positive integers")
    perf_analyzer = None if args.no_http else locate_perf_analyzer(args.perf_analyzer)
    if perf_analyzer is not None:
        facts = machine_facts(perf_analyzer)
    else:
        facts = {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": f"{usable_cpus()} usable",
            "python": platform.python_version(),
        }
    facts.pop("onnxruntime", None)
    for key, value in facts.items():
        print(f"  {key}: {value}")

    workdir = Path(tempfile.mkdtemp(prefix="tritonactor-bench-pb-"))
    repository = workdir / "models"
    write_repository(repository, sizes)
    rng = np.random.default_rng(0)

    in_process: dict[int, Timing] = {}
    backend: dict[int, list[Timing]] = {}
    # (a) and (b) run before the server starts, so nothing else competes for the cores.
    for elements in sizes:
        context = model_context(repository, model_name(elements))
        data = rng.random((1, elements), dtype=np.float32)
        print(f"[1,{elements}]: (a) in-process, (b) backend ...", flush=True)
        in_process[elements] = time_in_process(context, data, args.seconds)
        backend[elements] = [
            time_backend(context, data, args.seconds, n, args.loop) for n in batches
        ]

    served: dict[int, dict[int, Timing | None]] = {elements: {} for elements in sizes}
    floor_text = ""
    if perf_analyzer is not None and levels:
        process, url = start_server(repository, workdir)
        try:
            rate, cpu = http_floor(url, process.pid, 1.0)
            floor_text = (
                f"HTTP floor (GET /v2/health/live, one keep-alive connection): {rate:,.0f} req/s, "
                f"server CPU {_num(cpu)} µs/request."
            )
            for elements in sizes:
                for level in levels:
                    print(f"[1,{elements}]: (c) perf_analyzer c={level} ...", flush=True)
                    served[elements][level] = time_served(
                        perf_analyzer,
                        model_name(elements),
                        url,
                        level,
                        args.duration_ms,
                        workdir,
                        process.pid,
                    )
        finally:
            stop_server(process)

    results = [
        SizeResult(elements, in_process[elements], backend[elements], served[elements])
        for elements in sizes
    ]
    print()
    print(format_table(results))
    print()
    print(format_round_trips(results))
    print(
        "(a) TritonPythonModel.execute called in this process with a pb_utils request built per "
        f"call; (b) PythonInstance.execute awaited back to back on {args.loop} (stub process + "
        "/dev/shm); (c) perf_analyzer -i http, one hypercorn worker, one model instance."
    )
    print(
        "Round trip: server CPU = this process (the event loop, which reads the stub's socket); "
        "stub CPU = the stub process; per call = one execute of `batch` requests; messages/call "
        "= messages sent to the stub / received from it per call."
    )
    print(
        "µs/request = wall time / requests (1e6 / infer/s); p50 = one call's latency (for (c), "
        "as the client saw it). CPU µs/request: (a) this process; (b) this process + the stub; "
        "(c) the server's process tree (stub included), over the whole perf_analyzer run."
    )
    if any(t is not None and t.loose for r in results for t in r.served.values()):
        print(
            f"* did not settle within ±{STABILITY_PERCENT} %; measured with "
            f"±{RETRY_STABILITY_PERCENT} % (noisier)."
        )
    print(
        "other cores: CPU the rest of the machine used meanwhile; well above 0, something else "
        "was competing for the cores and the row is not trustworthy."
    )
    if floor_text:
        print(floor_text)
    failed = any(t is None for r in results for t in r.served.values())
    if args.keep or failed:
        print(f"repository, server log and perf_analyzer output: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        document = {"facts": facts, "args": vars(args), "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
