"""The Kafka harness (tests/helpers/kafka.py) end to end: a broker, records sent at a steady
rate, a real-time query from Spark's Kafka source to its Kafka sink, what reaches `out`
recorded with its arrival time. Oracle: the records sent to `in` (each comes back once, as
the query makes it from its input), and, for the count per key on arrowstate, what the
same count gives over the input in order. scripts/kafka_smoke.py runs it, in a process of
its own: a real-time query holds a task slot per partition of each stage, more than the
shared session's."""
import json
import os
import subprocess
import sys

import pytest

import kafka
import prerequisites
from storage import StorageUnavailable

SMOKE = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "kafka_smoke.py")
prerequisites.module("confluent_kafka", "the Kafka harness produces and reads with it: the "
                     "`test` extra")


@pytest.fixture(scope="module", autouse=True)
def jars():
    try:   # downloaded once (cached)
        kafka.broker_jars(), kafka.connector_jars()
    except StorageUnavailable as e:
        prerequisites.missing(f"Kafka's jars: {e}")


# a real-time batch longer than the run (stopped mid-batch): output held back to a batch's
# end would show as latencies near it (the warm-up's record back at the first batch's end,
# the measured ones sent in the next)
BATCH_S = 30


def _smoke(tmp_path, *args) -> dict:
    result = tmp_path / "result.json"
    done = subprocess.run([sys.executable, SMOKE, "--records", "100", "--json", str(result),
                           "--trigger", f"{BATCH_S} seconds", *args],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    print(done.stdout.splitlines()[-1])   # the latencies and times, for the log
    return json.loads(result.read_text())


def _sent(record) -> tuple:
    return record["key"], record["value"]["seq"], record["value"][kafka.PRODUCED_AT]


@pytest.mark.slow
def test_count_per_key_on_arrowstate_in_real_time_mode(tmp_path):
    # (the stateless query, `kafka_smoke.py` without --stateful, passes through the same
    # source, sink and recorder: run it by hand when the harness changes)
    got = _smoke(tmp_path, "--stateful")
    assert got["sent"] == 100 and got["latency_ms"]["count"] == 100
    # each record's output as it is processed, well within the real-time batch
    assert got["latency_ms"]["max"] < BATCH_S * 1000 / 6, got["latency_ms"]
    assert all(r["arrived_ns"] > r["value"][kafka.PRODUCED_AT] for r in got["out"])
    # each record once, key and production time as sent
    assert sorted(_sent(r) for r in got["out"]) == sorted(_sent(r) for r in got["in"])
    # a key's records are in one partition of `in`, in order: the count per key follows seq
    # (the warm-up's records have keys of their own)
    in_order: dict = {}
    for key, seq, _ in sorted((_sent(r) for r in got["in"]), key=lambda t: t[1]):
        in_order.setdefault(key, []).append(seq)
    expected = {k: [(seq, n) for n, seq in enumerate(seqs, 1)] for k, seqs in in_order.items()}
    seen: dict = {}
    for r in got["out"]:
        seen.setdefault(r["key"], []).append((r["value"]["seq"], r["value"]["n"]))
    assert {k: sorted(v) for k, v in seen.items()} == expected
