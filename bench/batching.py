"""Dynamic batching on a compute-bound model: served throughput without and with the dynamic
batcher, beside what the same onnxruntime session sustains in this process on the batches the
server formed.

    python bench/batching.py [--concurrency 16] [--delays-us 0,2000] [--duration-ms 2000]

It writes an FP32 MLP (512 -> 1024 -> 1024 -> 10, ReLU, about 3.2 MFLOP per sample) with
onnx.helper into a temporary repository, once per configuration: `mlp_plain` has no
`dynamic_batching`, `mlp_delay<N>` has `dynamic_batching { max_queue_delay_microseconds: N }`.
One hypercorn worker serves them all; perf_analyzer (HTTP, concurrency 16, batch 1 per request)
measures each in turn. The model's statistics, read before and after each run, give the batch
sizes the server actually executed. The in-process limit runs that same mix of batch sizes (and
batch 16) back to back on one session built with the server's session options, before the
server starts, and reports samples/s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_infer import (
    MAX_TRIALS,
    RETRY_MAX_TRIALS,
    RETRY_STABILITY_PERCENT,
    STABILITY_PERCENT,
    Load,
    Measurement,
    locate_perf_analyzer,
    machine_facts,
    run_perf_analyzer,
    start_server,
    stop_server,
    usable_cpus,
)

LAYERS = (512, 1024, 1024, 10)
MAX_BATCH_SIZE = 64


# -- the model ----------------------------------------------------------------------------------


def mlp_onnx(layers: Sequence[int] = LAYERS, seed: int = 0) -> bytes:
    """An FP32 MLP with a dynamic batch dimension: Gemm + Relu per hidden layer, Gemm last."""
    rng = np.random.default_rng(seed)
    nodes = []
    initializers = []
    current = "INPUT0"
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(layers)):
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
        weight = (weight / np.sqrt(fan_in)).astype(np.float32)
        bias = np.zeros(fan_out, dtype=np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{index}"),
            numpy_helper.from_array(bias, f"b{index}"),
        ]
        last = index == len(layers) - 2
        gemm_out = "OUTPUT0" if last else f"h{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [gemm_out]))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"r{index}"]))
            current = f"r{index}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", layers[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", layers[-1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def flops_per_sample(layers: Sequence[int] = LAYERS) -> int:
    return sum(2 * a * b for a, b in itertools.pairwise(layers))


def write_model(
    repository: Path,
    name: str,
    onnx_bytes: bytes,
    delay_us: int | None,
    layers: Sequence[int],
    intra_op_threads: int = 0,
) -> None:
    batching = (
        ""
        if delay_us is None
        else f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
    )
    if intra_op_threads:
        batching += (
            'parameters { key: "intra_op_thread_count" value: { string_value: '
            f'"{intra_op_threads}" }} }}\n'
        )
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.onnx").write_bytes(onnx_bytes)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        f"max_batch_size: {MAX_BATCH_SIZE}\n"
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {layers[0]} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {layers[-1]} ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + batching
    )


# -- the in-process limit -----------------------------------------------------------------------


def server_session(path: Path, intra_op_threads: int = 0) -> ort.InferenceSession:
    """Built as the ONNX backend builds it: the config's intra-op thread count (0: onnxruntime's
    default), sequential execution, every graph optimization, and idle intra-op threads
    sleeping instead of spinning (the server sets session.intra_op.allow_spinning=0)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def seconds_per_run(session: ort.InferenceSession, batch: int, duration_s: float) -> float:
    width = session.get_inputs()[0].shape[1]
    feeds = {"INPUT0": np.random.default_rng(batch).random((batch, width), dtype=np.float32)}
    for _ in range(20):
        session.run(None, feeds)
    runs = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < duration_s:
        session.run(None, feeds)
        runs += 1
    return elapsed / runs


def mix_rate(histogram: dict[int, int], per_run: dict[int, float]) -> float:
    """Samples/s of running each batch size as often as the server did, back to back."""
    samples = sum(size * count for size, count in histogram.items())
    seconds = sum(per_run[size] * count for size, count in histogram.items())
    return samples / seconds


# -- the server's statistics ----------------------------------------------------------------------


def batch_histogram(url: str, model: str) -> dict[int, int]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]
    return {
        int(batch["batch_size"]): int(batch["compute_infer"]["count"])
        for batch in stats["batch_stats"]
    }


def difference(after: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def describe(histogram: dict[int, int]) -> str:
    executions = sum(histogram.values())
    if not executions:
        return "-"
    mean = sum(size * count for size, count in histogram.items()) / executions
    top = sorted(histogram.items(), key=lambda item: -item[1])[:3]
    common = ", ".join(f"{size}: {count / executions:.0%}" for size, count in top)
    return f"mean {mean:.1f} ({common})"


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--hidden", type=int, default=1024, help="width of the two hidden layers (default 1024)"
    )
    parser.add_argument(
        "--delays-us",
        default="0,2000",
        help="max_queue_delay_microseconds values to try, comma-separated",
    )
    parser.add_argument(
        "--duration-ms", type=int, default=2000, help="perf_analyzer measurement window"
    )
    parser.add_argument(
        "--baseline-ms", type=int, default=700, help="in-process timing per batch size"
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=0,
        help="onnxruntime intra-op threads, in the configs and the in-process session alike "
        "(default 0: onnxruntime's choice, one per core)",
    )
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary (default: install one)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep logs and CSVs; print where")
    return parser.parse_args(argv)


def measure(
    perf_analyzer: str, model: str, url: str, args: argparse.Namespace, workdir: Path, pid: int
) -> tuple[Measurement | None, bool, Load]:
    served, load = run_perf_analyzer(
        perf_analyzer, model, url, args.concurrency, args.duration_ms, workdir,
        STABILITY_PERCENT, MAX_TRIALS, pid,
    )  # fmt: skip
    if served is not None:
        return served, False, load
    served, load = run_perf_analyzer(
        perf_analyzer, model, url, args.concurrency, args.duration_ms, workdir,
        RETRY_STABILITY_PERCENT, RETRY_MAX_TRIALS, pid,
    )  # fmt: skip
    return served, True, load


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    layers = (LAYERS[0], args.hidden, args.hidden, LAYERS[-1])
    delays = [int(d) for d in args.delays_us.split(",") if d.strip()]
    perf_analyzer = locate_perf_analyzer(args.perf_analyzer)
    facts = machine_facts(perf_analyzer)
    for key, value in facts.items():
        print(f"  {key}: {value}")
    print(
        f"model: FP32 MLP {'->'.join(map(str, layers))}, "
        f"{flops_per_sample(layers) / 1e6:.1f} MFLOP/sample; perf_analyzer, the hypercorn worker "
        f"and its onnxruntime threads share {usable_cpus()} CPUs.",
        flush=True,
    )

    workdir = Path(tempfile.mkdtemp(prefix="tritonactor-batching-"))
    repository = workdir / "models"
    onnx_bytes = mlp_onnx(layers)
    configs: list[tuple[str, int | None]] = [("mlp_plain", None)]
    configs += [(f"mlp_delay{d}", d) for d in delays]
    for name, delay in configs:
        write_model(repository, name, onnx_bytes, delay, layers, args.intra_op_threads)

    # Per-batch-size timings, before the server starts, so the two never compete for the cores.
    session = server_session(repository / "mlp_plain" / "1" / "model.onnx", args.intra_op_threads)
    per_run: dict[int, float] = {}

    def timed(batch: int) -> float:
        if batch not in per_run:
            per_run[batch] = seconds_per_run(session, batch, args.baseline_ms / 1000)
        return per_run[batch]

    for batch in (1, args.concurrency):
        timed(batch)

    process, url = start_server(repository, workdir)
    results = []
    try:
        for name, delay in configs:
            print(f"perf_analyzer -i http, concurrency {args.concurrency}, {name} ...", flush=True)
            before = batch_histogram(url, name)
            served, loose, load = measure(perf_analyzer, name, url, args, workdir, process.pid)
            histogram = difference(batch_histogram(url, name), before)
            results.append((name, delay, served, loose, load, histogram))
    finally:
        stop_server(process)

    # The formed batch sizes are known only now; time the ones not timed yet (server stopped).
    for *_, histogram in results:
        for batch in histogram:
            timed(batch)

    batch16 = args.concurrency / per_run[args.concurrency]
    plain = results[0][2]
    header = (
        "| configuration | served infer/s | p50 µs | p99 µs | batches executed (share) "
        "| in-process, same batch mix, samples/s | served / in-process (mix) "
        f"| served / in-process batch {args.concurrency} | vs no batching "
        "| server cores | perf_analyzer cores | other cores |"
    )
    lines = [header, "|---|" + "---:|" * 3 + "---|" + "---:|" * 7]
    for _name, delay, served, loose, load, histogram in results:
        label = "no dynamic_batching" if delay is None else f"max_queue_delay {delay} µs"
        limit = mix_rate(histogram, per_run) if histogram else None
        if served is None:
            cells = [label, "failed", "-", "-"]
        else:
            cells = [
                label,
                f"{served.infer_per_sec:,.0f}{'*' if loose else ''}",
                f"{served.p50_us:,.0f}",
                f"{served.p99_us:,.0f}",
            ]
        cells.append(describe(histogram))
        cells.append("-" if limit is None else f"{limit:,.0f}")
        ok = served is not None
        cells.append(f"{served.infer_per_sec / limit:.0%}" if ok and limit else "-")
        cells.append(f"{served.infer_per_sec / batch16:.0%}" if ok else "-")
        both = ok and plain is not None
        cells.append(f"{served.infer_per_sec / plain.infer_per_sec:.2f}x" if both else "-")
        cells.append("-" if load.server_cores is None else f"{load.server_cores:.2f}")
        cells.append(f"{load.client_cores:.2f}")
        cells.append("-" if load.other_cores is None else f"{load.other_cores:.2f}")
        lines.append("| " + " | ".join(cells) + " |")

    print()
    print("\n".join(lines))
    print()
    print("in-process (one session, server's options, one thread calling run back to back):")
    for batch in sorted(per_run):
        seconds = per_run[batch]
        print(f"  batch {batch:>3}: {seconds * 1e6:,.0f} µs/run, {batch / seconds:,.0f} samples/s")
    if any(r[3] for r in results):
        print(f"* did not settle within ±{STABILITY_PERCENT} %; measured with ±", end="")
        print(f"{RETRY_STABILITY_PERCENT} % (noisier)")
    print(
        f"served: perf_analyzer -i http, sync, batch 1 per request, window {args.duration_ms} ms; "
        "batch mix from the model's statistics over the whole perf_analyzer run."
    )
    if args.keep or any(r[2] is None for r in results):
        print(f"logs and perf_analyzer CSVs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        data = {
            "facts": facts,
            "args": {k: str(v) for k, v in vars(args).items()},
            "in_process_seconds_per_run": per_run,
            "rows": [
                {
                    "model": name,
                    "delay_us": delay,
                    "served": None if served is None else asdict(served),
                    "loose": loose,
                    "load": asdict(load),
                    "batches": histogram,
                }
                for name, delay, served, loose, load, histogram in results
            ],
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if all(r[2] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
