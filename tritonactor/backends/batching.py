"""Running several requests as one: merge their inputs along the batch dimension, and split the
merged response back into one response per request. For backends whose model takes a batch."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from tritonactor.core.errors import internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

__all__ = ["batch_size", "groups", "merge", "shape_key", "split"]


def batch_size(request: InferenceRequest) -> int:
    """The request's batch size: the first dim its inputs share (1 when it has no input)."""
    for tensor in request.inputs:
        if tensor.shape:
            return int(tensor.shape[0])
    return 1


def shape_key(request: InferenceRequest) -> Hashable:
    """Requests with equal keys can be concatenated: the same inputs, of the same data types,
    with the same shape past the batch dimension."""
    return tuple(
        sorted((tensor.name, tensor.datatype, tuple(tensor.shape[1:])) for tensor in request.inputs)
    )


def groups(requests: list[InferenceRequest]) -> list[list[int]]:
    """The indices of `requests`, grouped by `shape_key`, each group in request order."""
    by_key: dict[Hashable, list[int]] = {}
    for index, request in enumerate(requests):
        by_key.setdefault(shape_key(request), []).append(index)
    return list(by_key.values())


def merge(requests: list[InferenceRequest]) -> tuple[InferenceRequest, list[int]]:
    """One request whose every input is the requests' inputs concatenated along axis 0, and
    each request's batch size. The requests must share a `shape_key`. The merged request asks
    for every output any of them asked for (all outputs if one of them asked for none)."""
    first = requests[0]
    sizes = [batch_size(request) for request in requests]
    inputs = []
    for tensor in first.inputs:
        parts = [_input(request, tensor.name).data for request in requests]
        data = np.concatenate(parts, axis=0)
        inputs.append(Tensor(tensor.name, tensor.datatype, tuple(data.shape), data))
    outputs: list[RequestedOutput] = []
    if all(request.outputs for request in requests):
        seen: set[str] = set()
        for request in requests:
            for output in request.outputs:
                if output.name not in seen:
                    seen.add(output.name)
                    outputs.append(RequestedOutput(output.name))
    merged = InferenceRequest(
        model_name=first.model_name,
        model_version=first.model_version,
        inputs=inputs,
        outputs=outputs,
        resolved_version=first.resolved_version,
    )
    return merged, sizes


def split(
    response: InferenceResponse, sizes: list[int], requests: list[InferenceRequest]
) -> list[InferenceResponse]:
    """The merged `response` cut back into one response per request, each with the request's
    id and only the outputs it asked for (in its order; all of them when it named none).
    INTERNAL if an output does not carry the whole batch along its first dimension."""
    total = sum(sizes)
    by_name = {tensor.name: tensor for tensor in response.outputs}
    for tensor in response.outputs:
        if not tensor.shape or tensor.shape[0] != total:
            raise internal(
                f"output '{tensor.name}' of shape {list(tensor.shape)} does not have the "
                f"batch of {total} as its first dimension; it cannot be split per request"
            )
    responses = []
    start = 0
    for request, size in zip(requests, sizes, strict=True):
        names = request.requested_output_names or list(by_name)
        outputs = []
        for name in names:
            tensor = by_name[name]
            data = tensor.data[start : start + size]
            outputs.append(
                Tensor(name, tensor.datatype, tuple(data.shape), data, dict(tensor.parameters))
            )
        start += size
        responses.append(
            InferenceResponse(
                model_name=response.model_name,
                model_version=response.model_version,
                id=request.id,
                outputs=outputs,
                parameters=dict(response.parameters),
            )
        )
    return responses


def _input(request: InferenceRequest, name: str) -> Tensor:
    tensor = request.input(name)
    if tensor is None:
        raise internal(f"request '{request.id}' has no input '{name}' to batch")
    return tensor
