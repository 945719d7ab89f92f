"""The real-time bench's summary of a case's rounds (scripts/bench_lib/real_time.py): medians
of the rounds' figures, and each round's latency over the reference case's in the same
round, since the machine's speed drifts between rounds (no Kafka, no Spark)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_lib.real_time import REFERENCE, summary  # noqa: E402


def _line(case, round_, p50, p99, never=0):
    return {"case": case, "engine": "e", "mode": "real-time", "checkpoint": "local",
            "records_per_s": 1000, "round": round_, "p50_ms": p50, "p99_ms": p99,
            "never_received": never}


def test_each_round_is_measured_against_the_reference_of_its_own_round():
    # the machine slows in round 2: both engines climb, the ratio within each round holds
    ours = [_line("rows", 1, 6.0, 30.0), _line("rows", 2, 20.0, 90.0, never=2),
            _line("rows", 3, 7.0, 33.0)]
    spark = [_line(REFERENCE, 1, 3.0, 20.0), _line(REFERENCE, 2, 16.0, 100.0),
             _line(REFERENCE, 3, 3.5, 22.0)]
    got = summary(ours, spark)
    assert got["p50_ms"] == 7.0 and got["p50_ms_by_round"] == [6.0, 20.0, 7.0]
    assert got["p50_vs_reference_by_round"] == [2.0, 1.25, 2.0]
    assert got["p50_vs_reference"] == 2.0   # not 7.0 / 3.5 by luck of the medians
    assert got["p99_vs_reference_by_round"] == [1.5, 0.9, 1.5]
    assert got["p99_vs_reference"] == 1.5
    assert got["reference"] == REFERENCE and got["never_received"] == 2


def test_rounds_without_a_reference_give_no_ratio():
    got = summary([_line("rows", 1, 6.0, 30.0)], [_line(REFERENCE, 2, 3.0, 20.0)])
    assert "p50_vs_reference" not in got and "reference" not in got
    assert "reference" not in summary([_line(REFERENCE, 1, 3.0, 20.0)])
