"""Header forwarding and restricted APIs as the front ends apply them (frontends/headers.py,
frontends/restrictions.py), without a server."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tritonactor.core.protocol import compile_forward_pattern
from tritonactor.core.types import InferenceRequest
from tritonactor.frontends import restrictions
from tritonactor.frontends.headers import HeaderForwarder
from tritonactor.frontends.restrictions import (
    CATEGORIES,
    GRPC_HEADER_PREFIX,
    GRPC_METHODS,
    Restrictions,
)
from tritonactor.settings import Settings


@pytest.mark.parametrize(
    ("pattern", "name", "forwarded"),
    [
        ("my_header.*", "my_header_1", True),
        ("MY_HEADER.*", "my_header_1", True),  # case-insensitive by default, as RE2 in Triton
        ("(?-i)MY_HEADER.*", "my_header_1", False),
        ("(?-i)my_header.*", "my_header_1", True),
        ("header", "x-my-header-y", True),  # a partial match, as RE2::PartialMatch
        ("^header", "x-header", False),
        (".*", "anything", True),
    ],
)
def test_forward_pattern_matches_as_triton(pattern: str, name: str, forwarded: bool) -> None:
    request = InferenceRequest("m")

    HeaderForwarder(pattern).forward(request, [(name, "v")])

    assert request.headers == ({name: "v"} if forwarded else {})
    assert request.model_parameters == request.headers
    assert request.parameters == {}


def test_no_pattern_forwards_nothing() -> None:
    request = InferenceRequest("m")
    forwarder = HeaderForwarder("")

    forwarder.forward(request, [("my_header", "v")])

    assert not forwarder.enabled
    assert request.model_parameters == {}


def test_a_header_never_replaces_a_request_parameter() -> None:
    request = InferenceRequest("m", parameters={"my_header": 1})

    HeaderForwarder(".*").forward(request, [("my_header", "v"), ("other", "o")])

    assert request.model_parameters == {"my_header": 1, "other": "o"}


def test_a_header_named_like_a_scheduling_parameter_is_only_the_model_s() -> None:
    # Triton forwards a `priority: u=0` header to the model as a string and schedules as if
    # it were not there.
    request = InferenceRequest("m", parameters={"timeout": 5})

    HeaderForwarder(".*").forward(request, [("priority", "u=0, i"), ("sequence_id", "7")])

    assert request.parameters == {"timeout": 5}
    assert request.model_parameters == {"priority": "u=0, i", "sequence_id": "7"}


def test_a_bad_pattern_is_refused() -> None:
    with pytest.raises(re.error):
        compile_forward_pattern("my_header(")


@dataclass(frozen=True)
class Rule:
    apis: frozenset[str]
    key: str
    value: str


def test_restrictions_name_the_header_a_category_lacks() -> None:
    needs = Restrictions(
        [
            Rule(frozenset({"health", "model-repository"}), "Admin-Key", "admin"),
            Rule(frozenset({"inference"}), "infer-key", "go"),
        ]
    )
    headers = {"admin-key": "admin"}

    assert needs.missing("health", headers.get) is None
    assert needs.missing("model-repository", headers.get) is None
    assert needs.missing("inference", headers.get) == "infer-key"
    assert needs.missing("inference", {"infer-key": "wrong"}.get) == "infer-key"
    assert needs.missing("statistics", {}.get) is None  # not restricted
    assert needs


def test_grpc_restrictions_want_the_prefixed_header() -> None:
    needs = Restrictions([Rule(frozenset({"health"}), "admin-key", "v")], GRPC_HEADER_PREFIX)

    assert needs.missing("health", {"admin-key": "v"}.get) == "triton-grpc-protocol-admin-key"
    assert needs.missing("health", {"triton-grpc-protocol-admin-key": "v"}.get) is None


def test_no_restriction_is_falsy() -> None:
    assert not Restrictions([])


def test_every_grpc_method_has_a_known_category() -> None:
    from tritonactor._proto import inference as pb

    class Probe(pb.GrpcInferenceServiceBase):
        pass

    methods = set(Probe().__mapping__())  # type: ignore[abstract]
    assert methods <= set(GRPC_METHODS)
    assert set(GRPC_METHODS.values()) <= set(CATEGORIES)


def test_the_front_ends_know_exactly_the_categories_the_settings_accept() -> None:
    named = {
        value
        for name, value in vars(restrictions).items()
        if name.isupper() and isinstance(value, str) and name != "GRPC_HEADER_PREFIX"
    }
    assert named == set(CATEGORIES)
    everything = Settings(http_restricted_api=f"{','.join(CATEGORIES)}:k=v")
    assert everything.http_restricted_api[0].apis == frozenset(CATEGORIES)
