"""The typed messages between a front-end process and the engine.

Front end → engine: `Call` (a method of the engine's server, by name), `Submit` (an inference
request), `Cancel` (its client went away). Engine → front end: `Answer`/`Failed` (a call's or a
request's outcome), `Part` (one response of a decoupled model's stream), `Table` (the ready
model versions, sent whenever they change, before anything that depends on the change), and
`Regions` (the shared-memory regions clients registered, likewise). Both ways: `Released`
(lane slots the receiver is done with: its views of them gone) and `Dropped` (lane slots the sender
gave up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import Place
from tritonactor.scheduling.signature import ModelSignature


@dataclass(frozen=True, slots=True)
class Call:
    id: int
    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Submit:
    """`streamed`: the model's responses come back as `Part`s (a decoupled model's sender).
    `targets`: outputs the client asked for in its system shared-memory regions, and where
    (`SharedMemoryRegistry.locate`'s places): the engine writes them there itself."""

    id: int
    request: InferenceRequest
    streamed: bool = False
    targets: tuple[tuple[str, Place], ...] = ()


@dataclass(frozen=True, slots=True)
class Ask:
    """Engine → front end: a question only the front end can answer (which shared-memory
    regions its requests hold), answered with an `Answer` of the same id."""

    id: int
    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Cancel:
    id: int


@dataclass(frozen=True, slots=True)
class Released:
    """Either way: the receiver has copied these slots of the sender's lane out
    (engine/lanes.py); the sender may reuse them."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Dropped:
    """Either way: the sender no longer has these slots of its lane (it made room for larger
    ones); the receiver unmaps them."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """`links`: for a traced request, the spans its front end's span is to link to (the batch
    that carried it)."""

    id: int
    value: Any
    links: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Failed:
    id: int
    error: TritonError


@dataclass(frozen=True, slots=True)
class Part:
    id: int
    response: InferenceResponse | None
    error: TritonError | None
    final: bool


@dataclass(frozen=True, slots=True)
class Version:
    """A ready version as a front end needs it: to validate and describe, never to run."""

    name: str
    version: int
    config: ModelConfig
    signature: ModelSignature


@dataclass(frozen=True, slots=True)
class Table:
    versions: tuple[Version, ...]
    known: frozenset[str]
    tried: dict[str, frozenset[int]]  # (Router.tried)


@dataclass(frozen=True, slots=True)
class Region:
    """A registered region as the registry was asked for it."""

    kind: Kind
    name: str
    key: str
    handle: bytes
    device_id: int
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class Regions:
    regions: tuple[Region, ...]


@dataclass(frozen=True, slots=True)
class Join:
    """A front end's first message: from then on the engine serves it, and stops once every
    front end that joined has gone (a connection that only probes whether the engine runs
    never joins). `protocol`: the version of these messages it speaks."""

    pid: int
    protocol: str


@dataclass(frozen=True, slots=True)
class Leave:
    """A front end that stops. The last one to leave is answered by the engine closing its
    connection once its listeners are closed (so that a server whose processes have all
    exited leaves no port behind); the others with an `Answer`."""

    id: int


@dataclass(frozen=True, slots=True)
class Hello:
    """The engine's first message on a connection: what every front end must agree on
    (`protocol`: the version of these messages the engine speaks)."""

    pid: int
    lazy: bool
    protocol: str


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """Trace settings a front end changed (`model` "" = the global ones): every front end
    samples the requests it receives with the same settings."""

    model: str
    changes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TraceUsed:
    """Front end → engine: a request it traced used up one of the trace_count of `model`'s
    scope ("" = the global one). The engine counts for every front end and sends the count
    left to all of them (as a `TraceSettings` change)."""

    model: str


@dataclass(frozen=True, slots=True)
class TraceLeft:
    """Engine → front ends: what is left of `model`'s trace_count ("" = the global one) after
    a front end's `TraceUsed`; a front end never raises its own count to it."""

    model: str
    left: int


@dataclass(frozen=True, slots=True)
class TraceState:
    """Engine → a front end that joins: the trace settings in force (`TraceSettings.snapshot`),
    changed since the server started, perhaps."""

    snapshot: tuple[dict[str, Any], dict[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Log settings a front end changed (applied in every front end as in the engine)."""

    settings: dict[str, object]
