"""A python model's config reshapes (backends/python/wire.py `Reshapes`), as Triton 2.51
applies them: each -1 of the shape a tensor goes to takes the size of the tensor's own variable
dimensions, in order (a model with input dims [-1, -1] and reshape [-1, 1, -1] sees a [2, 2, 3]
request as [2, 2, 1, 3] on Triton)."""

from __future__ import annotations

import numpy as np
import pytest

from tritonactor._proto import inference as pb
from tritonactor.backends.python.wire import Reshapes
from tritonactor.core.errors import ErrorCode, TritonError


def _config(max_batch_size: int, dims: list[int], reshape: list[int]) -> pb.ModelConfig:
    return pb.ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        input=[pb.ModelInput(name="IN", dims=dims, reshape=pb.ModelTensorReshape(shape=reshape))],
        output=[
            pb.ModelOutput(name="OUT", dims=dims, reshape=pb.ModelTensorReshape(shape=reshape))
        ],
    )


@pytest.mark.parametrize(
    ("batch", "dims", "reshape", "shape", "seen"),
    [
        (4, [-1, -1], [-1, 1, -1], (2, 2, 3), (2, 2, 1, 3)),
        (4, [-1, -1], [-1, 1, -1], (1, 5, 7), (1, 5, 1, 7)),
        (4, [3], [1, 3], (2, 3), (2, 1, 3)),
        (0, [3], [1, 3], (3,), (1, 3)),
        (0, [-1, 2], [2, -1], (4, 2), (2, 4)),
        (4, [1], [], (3, 1), (3,)),
    ],
)
def test_a_tensor_moves_between_its_dims_and_its_reshape(
    batch: int, dims: list[int], reshape: list[int], shape: tuple[int, ...], seen: tuple[int, ...]
) -> None:
    reshapes = Reshapes.of("m", _config(batch, dims, reshape))
    assert reshapes is not None
    data = np.arange(int(np.prod(shape))).reshape(shape)
    moved = reshapes.input("IN", data)
    assert moved.shape == seen
    assert reshapes.output("OUT", moved).shape == shape  # and back, for an output
    assert reshapes.input("OTHER", data) is data


def test_a_config_without_reshapes_has_none() -> None:
    config = pb.ModelConfig(name="m", input=[pb.ModelInput(name="IN", dims=[3])])
    assert Reshapes.of("m", config) is None


def test_a_shape_the_reshape_cannot_take_is_invalid() -> None:
    reshapes = Reshapes.of("m", _config(0, [4], [3]))
    assert reshapes is not None
    with pytest.raises(TritonError) as raised:
        reshapes.input("IN", np.zeros(4))
    assert raised.value.code is ErrorCode.INVALID_ARG
    assert "cannot take the config's shape [3]" in raised.value.message
