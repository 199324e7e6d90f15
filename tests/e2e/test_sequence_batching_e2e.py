"""The sequence batcher behind the real server: stateful python models driven by tritonclient
with sequence_id / sequence_start / sequence_end. `sequence_accumulate` keeps a running sum;
`sequence_batch_report` also reports how it was batched (its row, and the READY and CORRID
controls of every row), served with the direct and the oldest strategy."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import ServerProcess, start_server, wait_for

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence_repo")
    shutil.copytree(MODELS / "sequence_accumulate", repo / "sequence_accumulate")
    # Two instances, one slot each (max_batch_size 0, direct): two sequences at a time.
    config = repo / "sequence_accumulate" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    report = MODELS / "sequence_batch_report"
    shutil.copytree(report, repo / "report_direct")
    shutil.copytree(report, repo / "report_oldest")
    text = (report / "config.pbtxt").read_text()
    (repo / "report_direct" / "config.pbtxt").write_text(
        text.replace('"sequence_batch_report"', '"report_direct"')
    )
    # Oldest: the queue delay (ten minutes) never runs out within a test, so a batch is cut
    # only when full, one request of each of the four sequences, however they arrive.
    (repo / "report_oldest" / "config.pbtxt").write_text(
        text.replace('"sequence_batch_report"', '"report_oldest"').replace(
            "direct { }",
            "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 600000000 }",
        )
    )
    process = start_server([repo], tmp_path_factory.mktemp("sequence_server"))
    yield process
    process.stop()


def http_send(
    client: httpclient.InferenceServerClient, value: int, sequence_id: int, **flags: bool
) -> int:
    tensor = httpclient.InferInput("INPUT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    result = client.infer("sequence_accumulate", [tensor], sequence_id=sequence_id, **flags)
    return int(result.as_numpy("OUTPUT")[0])


def test_two_interleaved_sequences_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    sums = [
        http_send(client, 1, 1001, sequence_start=True),
        http_send(client, 10, 1002, sequence_start=True),
        http_send(client, 2, 1001),
        http_send(client, 20, 1002),
        http_send(client, 3, 1001, sequence_end=True),
        http_send(client, 30, 1002, sequence_end=True),
    ]
    assert sums == [1, 10, 3, 30, 6, 60]


def test_sequence_errors_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        http_send(client, 1, 2001)
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        http_send(client, 1, 0)


def test_a_sequence_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        sums = []
        for step, value in enumerate((4, 5, 6)):
            tensor = grpcclient.InferInput("INPUT", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            result = client.infer(
                "sequence_accumulate",
                [tensor],
                sequence_id=3001,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )
            sums.append(int(result.as_numpy("OUTPUT")[0]))
        assert sums == [4, 9, 15]
    finally:
        client.close()


def report(
    client: httpclient.InferenceServerClient,
    model: str,
    value: int,
    sequence_id: int,
    **flags: bool,
) -> dict[str, list[int]]:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    return {
        name: result.as_numpy(name)[0].tolist()
        for name in ("OUTPUT", "SLOT", "READY_ROWS", "CORRID_ROWS")
    }


def run_sequence(
    url: str, model: str, sequence_id: int, values: list[int], first: int = 0
) -> list[dict]:
    """Steps `first`.. of the sequence `values` (START with step 0, END with the last)."""
    client = httpclient.InferenceServerClient(url)
    answers = []
    for step in range(first, len(values)):
        flags = {"sequence_start": step == 0, "sequence_end": step == len(values) - 1}
        answers.append(report(client, model, values[step], sequence_id, **flags))
    return answers


def run_concurrently(
    url: str, model: str, sequences: dict[int, list[int]], first: int = 0
) -> dict[int, list]:
    with ThreadPoolExecutor(len(sequences)) as pool:
        futures = {
            corrid: pool.submit(run_sequence, url, model, corrid, values, first)
            for corrid, values in sequences.items()
        }
        return {corrid: future.result(timeout=60) for corrid, future in futures.items()}


SEQUENCES = {corrid: [corrid * 10 + step for step in range(6)] for corrid in (41, 42, 43, 44)}


def check_sums(answers: dict[int, list[dict]]) -> None:
    # Each client got its own sequence's running sums, in order: no null row's output, no
    # other sequence's, reached it.
    for corrid, values in SEQUENCES.items():
        sums = [sum(values[: step + 1]) for step in range(len(values))]
        assert [answer["OUTPUT"][0] for answer in answers[corrid]] == sums


def test_direct_batches_concurrent_sequences_in_their_slots(server: ServerProcess) -> None:
    # Each sequence starts once the one before has its answer, so all four hold a slot (the
    # lowest free one: 41 slot 0 ... 44 slot 3) before the rest of them run concurrently.
    client = httpclient.InferenceServerClient(server.url)
    started = {
        corrid: report(client, "report_direct", values[0], corrid, sequence_start=True)
        for corrid, values in SEQUENCES.items()
    }
    rest = run_concurrently(server.url, "report_direct", SEQUENCES, first=1)
    answers = {corrid: [started[corrid], *rest[corrid]] for corrid in SEQUENCES}
    check_sums(answers)
    everything = [answer for sequence in answers.values() for answer in sequence]
    # One request per slot, at its slot's row; a row without a request (READY 0) is a null
    # row, CORRID 0. An execute has a row for every slot up to the highest it serves: a request
    # of slot 3 runs with rows 0 to 3.
    assert max(len(answer["READY_ROWS"]) for answer in everything) == 4
    slots: dict[int, set[int]] = {}
    for corrid, sequence in answers.items():
        for answer in sequence:
            slot = answer["SLOT"][0]
            slots.setdefault(corrid, set()).add(slot)
            assert answer["READY_ROWS"][slot] == 1 and answer["CORRID_ROWS"][slot] == corrid
            for ready, row_corrid in zip(answer["READY_ROWS"], answer["CORRID_ROWS"], strict=True):
                assert ready == 1 or row_corrid == 0
            assert len(set(answer["CORRID_ROWS"]) - {0}) == sum(answer["READY_ROWS"])
    # A sequence keeps its slot; four sequences, four slots.
    assert all(len(held) == 1 for held in slots.values()), slots
    assert sorted(held.pop() for held in slots.values()) == [0, 1, 2, 3]


def test_direct_backlogs_a_fifth_sequence_until_a_slot_frees(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for corrid in (51, 52, 53, 54):
        report(client, "report_direct", 1, corrid, sequence_start=True)
    fifth: dict[str, list[int]] = {}
    waiting = threading.Thread(
        target=lambda: fifth.update(
            report(
                httpclient.InferenceServerClient(server.url),
                "report_direct",
                7,
                55,
                sequence_start=True,
            )
        )
    )
    assert server.pending("report_direct") == 0
    waiting.start()
    # the fifth sequence's first request has reached the server, which holds it: every slot is
    # held by a running sequence
    wait_for(lambda: server.pending("report_direct") == 1, timeout=60)
    assert not fifth
    ended = report(client, "report_direct", 1, 52, sequence_end=True)
    waiting.join(timeout=10)
    assert fifth["OUTPUT"] == [7]
    assert fifth["SLOT"] == ended["SLOT"]  # sequence 55 took the slot sequence 52 left
    for corrid in (51, 53, 54, 55):
        report(client, "report_direct", 0, corrid, sequence_end=True)


def test_oldest_batches_one_request_per_sequence(server: ServerProcess) -> None:
    # Each client sends a sequence's next request once the last is answered, and a batch is
    # cut only when full: every execute runs one request of each of the four sequences.
    answers = run_concurrently(server.url, "report_oldest", SEQUENCES)
    check_sums(answers)
    everything = [answer for sequence in answers.values() for answer in sequence]
    for answer in everything:
        assert answer["READY_ROWS"] == [1, 1, 1, 1]  # compact: no null rows
        # one request of each sequence per batch
        assert sorted(answer["CORRID_ROWS"]) == sorted(SEQUENCES)
