"""Write the bundled example model repository (`tritonactor/examples/models/`).

    python -m tritonactor.examples.build [REPOSITORY]

Needs the `onnx` package (a test dependency). The files it writes are committed, so an installed
server serves the examples without `onnx`. The output is deterministic: rerunning it on an
unchanged builder leaves the committed files byte for byte the same.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR version 8 goes with opset 17 and is read by every onnxruntime since 1.11.
IR_VERSION = 8
DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "models"

SIMPLE_CONFIG = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""

MLP_FEATURES = 64
MLP_HIDDEN = 256
MLP_CLASSES = 10

MLP_CONFIG = f"""\
name: "mlp_classifier"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {{
    name: "features"
    data_type: TYPE_FP32
    dims: [ {MLP_FEATURES} ]
  }}
]
output [
  {{
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ {MLP_CLASSES} ]
  }}
]
instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
"""


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tritonactor.examples.build",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def simple_model() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, INT32 [batch, 16]."""
    shape = ["batch", 16]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")],
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, shape)
            for n in ("OUTPUT0", "OUTPUT1")
        ],
    )
    return _model(graph)


def mlp_weights() -> list[tuple[np.ndarray, np.ndarray]]:
    """The (weight, bias) of each layer, from a fixed seed: the same numbers on every run."""
    rng = np.random.default_rng(0)
    sizes = [MLP_FEATURES, MLP_HIDDEN, MLP_HIDDEN, MLP_CLASSES]
    layers = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        # He scaling keeps activations of order one through the ReLUs, so the softmax is not
        # saturated and small numeric differences stay visible in tests.
        weight = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        bias = rng.standard_normal(fan_out) * 0.01
        layers.append((weight.astype(np.float32), bias.astype(np.float32)))
    return layers


def mlp_model() -> onnx.ModelProto:
    """features FP32 [batch, 64] -> 256 -> 256 -> 10 (ReLU between) -> softmax probabilities."""
    nodes = []
    initializers = []
    current = "features"
    layers = mlp_weights()
    for index, (weight, bias) in enumerate(layers):
        w_name, b_name, out = f"fc{index}.weight", f"fc{index}.bias", f"fc{index}"
        initializers += [
            numpy_helper.from_array(weight, w_name),
            numpy_helper.from_array(bias, b_name),
        ]
        nodes.append(helper.make_node("Gemm", [current, w_name, b_name], [out]))
        current = out
        if index < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"relu{index}"]))
            current = f"relu{index}"
    nodes.append(helper.make_node("Softmax", [current], ["probabilities"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "mlp_classifier",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", MLP_FEATURES])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", MLP_CLASSES])],
        initializer=initializers,
    )
    return _model(graph)


def _write(repository: Path, name: str, config: str, model: onnx.ModelProto) -> None:
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    onnx.save_model(model, str(version_dir / "model.onnx"))


def build(repository: Path = DEFAULT_REPOSITORY) -> None:
    """Write every example model under `repository`, replacing files already there."""
    _write(repository, "simple", SIMPLE_CONFIG, simple_model())
    _write(repository, "mlp_classifier", MLP_CONFIG, mlp_model())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", nargs="?", type=Path, default=DEFAULT_REPOSITORY)
    args = parser.parse_args(argv)
    build(args.repository)
    print(f"wrote example models to {args.repository}")


if __name__ == "__main__":
    main()
