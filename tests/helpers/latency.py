"""What a paced run's records took, end to end (pure Python: kafka.py's PacedProducer keeps a
Schedule, scripts/bench_lib/real_time.py and the unit tests measure with it).

Latency is taken from each record's scheduled send time, not from when it was sent: a
producer that falls behind its schedule (its client's queue full, the machine busy) sends
late, and measuring from the late send would leave that wait out, the coordinated omission
of a closed-loop load generator. A record that never comes back is counted, not left out."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class Schedule:
    """Record `seq` is due at start_ns + seq / rate seconds (time.time_ns(), wall clock)."""
    start_ns: int
    rate: float   # records a second

    def due_ns(self, seq: int) -> int:
        return self.start_ns + round(seq * 1e9 / self.rate)

    def due_within(self, start_ns: int, end_ns: int) -> range:
        """The records due in [start_ns, end_ns)."""
        def first_due_at_or_after(t: int) -> int:
            seq = max(0, math.ceil((t - self.start_ns) * self.rate / 1e9))
            while self.due_ns(seq) < t:          # (rounding)
                seq += 1
            while seq > 0 and self.due_ns(seq - 1) >= t:
                seq -= 1
            return seq
        first = first_due_at_or_after(start_ns)
        return range(first, max(first, first_due_at_or_after(end_ns)))


Output = tuple[int, str, int]   # an output record: (arrived_ns, key, seq it carries)


def first_arrivals(seqs: Iterable[int], outputs: Iterable[Output],
                   key_of: Callable[[int], str] | None = None) -> dict[int, int]:
    """{seq: arrived_ns} of the records of `seqs` that came back. Without `key_of`, an output
    stands for the record whose seq it carries (the first of its copies counts). With it (a
    query that outputs a key's aggregate, carrying the newest seq the key has seen: a key's
    records arrive in seq order, in one partition), an output stands for every record of its
    key up to that seq; `key_of(seq)` is a record's key. A record is received with the
    first output that stands for it."""
    wanted = sorted(set(seqs))
    arrived: dict[int, int] = {}
    if key_of is None:
        first: dict[int, int] = {}
        for at, _, seq in outputs:
            if seq not in first or at < first[seq]:
                first[seq] = at
        return {s: first[s] for s in wanted if s in first}
    by_key: dict[str, list[tuple[int, int]]] = {}
    for at, key, seq in outputs:
        by_key.setdefault(key, []).append((at, seq))
    records: dict[str, list[int]] = {}
    for s in wanted:
        records.setdefault(key_of(s), []).append(s)
    for key, seqs_of_key in records.items():
        got = sorted(by_key.get(key, []))   # in the order they arrived
        newest, at, i = -1, 0, 0
        for s in seqs_of_key:
            while newest < s and i < len(got):
                at, newest = got[i][0], max(newest, got[i][1])
                i += 1
            if newest < s:
                break   # no output of the key stands for this record, nor for later ones
            arrived[s] = at
    return arrived


def schedule_latencies(schedule: Schedule, seqs: Iterable[int], outputs: Iterable[Output],
                       key_of: Callable[[int], str] | None = None
                       ) -> tuple[dict[int, float], list[int]]:
    """({seq: ms from its scheduled send to its first arrival} of the records received,
    [seqs never received]), for the records `seqs` (first_arrivals says which output stands
    for which record)."""
    seqs = sorted(set(seqs))
    arrived = first_arrivals(seqs, outputs, key_of)
    return ({s: (arrived[s] - schedule.due_ns(s)) / 1e6 for s in seqs if s in arrived},
            [s for s in seqs if s not in arrived])


def latency_summary(latencies_ms: list[float]) -> dict[str, float]:
    """count, p50, p99 and max of latencies in ms (nearest-rank percentiles)."""
    ordered = sorted(latencies_ms)
    if not ordered:
        return {"count": 0}
    return {"count": len(ordered), "p50": percentile(ordered, 50),
            "p99": percentile(ordered, 99), "max": ordered[-1]}


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank q-th percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]
