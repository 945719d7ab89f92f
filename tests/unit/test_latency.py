"""tests/helpers/latency.py, which the real-time bench measures with: latency from each
record's scheduled send time, records never received counted (no Kafka, no Spark)."""
from latency import Schedule, first_arrivals, latency_summary, schedule_latencies

MS = 1_000_000   # ns
T0 = 1_700_000_000 * 1_000_000_000


def test_the_schedule_gives_each_record_its_due_time_and_the_records_due_in_a_window():
    s = Schedule(T0, 1000)   # a record a ms
    assert [s.due_ns(i) for i in (0, 1, 1500)] == [T0, T0 + MS, T0 + 1500 * MS]
    assert s.due_within(T0 + 10 * MS, T0 + 20 * MS) == range(10, 20)
    assert s.due_within(T0 + 10 * MS + 1, T0 + 20 * MS + 1) == range(11, 21)
    assert s.due_within(T0 - 5 * MS, T0 + 2 * MS) == range(0, 2)
    third = Schedule(T0, 3)   # due times rounded to the ns
    window = third.due_within(T0 + 1, T0 + 10**9 + 1)
    assert list(window) == [1, 2, 3]
    assert all(T0 + 1 <= third.due_ns(i) < T0 + 10**9 + 1 for i in window)


def test_latency_counts_from_the_scheduled_send_not_the_late_one():
    """The producer fell 400 ms behind at record 2 (sent all three at once at +400 ms) and
    each came back 5 ms after it was sent: measured from the schedule, the wait shows."""
    s = Schedule(T0, 10)   # due at 0, 100, 200 ms
    sent = T0 + 400 * MS
    outputs = [(sent + 5 * MS, "k", seq) for seq in range(3)]
    latencies, never = schedule_latencies(s, range(3), outputs)
    assert latencies == {0: 405.0, 1: 305.0, 2: 205.0} and never == []


def test_records_never_received_are_counted_and_duplicates_count_once():
    s = Schedule(T0, 1000)
    outputs = [(T0 + 3 * MS, "a", 0), (T0 + 9 * MS, "a", 0),   # at least once: a copy
               (T0 + 7 * MS, "b", 2), (T0 + 50 * MS, "c", 99)]   # 99: outside the window
    latencies, never = schedule_latencies(s, range(5), outputs)
    assert latencies == {0: 3.0, 2: 5.0}
    assert never == [1, 3, 4]
    assert schedule_latencies(s, range(3), []) == ({}, [0, 1, 2])


def test_an_aggregate_stands_for_its_keys_records_up_to_the_newest_it_carries():
    """A count per key carries the newest seq it counted: it stands for every record of its
    key up to that one, each received with the first output that covers it."""
    def key_of(seq):
        return "even" if seq % 2 == 0 else "odd"
    outputs = [(T0 + 10 * MS, "even", 2),    # covers 0 and 2
               (T0 + 12 * MS, "even", 2),    # again: nothing new
               (T0 + 30 * MS, "even", 6),    # covers 4 and 6
               (T0 + 11 * MS, "odd", 1)]     # covers 1; 3 and 5 never come
    assert first_arrivals(range(7), outputs, key_of) == {
        0: T0 + 10 * MS, 2: T0 + 10 * MS, 4: T0 + 30 * MS, 6: T0 + 30 * MS, 1: T0 + 11 * MS}
    latencies, never = schedule_latencies(Schedule(T0, 1000), range(7), outputs, key_of)
    assert latencies == {0: 10.0, 1: 10.0, 2: 8.0, 4: 26.0, 6: 24.0} and never == [3, 5]
    # the same outputs standing for one record each: 0 and 4 were never answered
    assert schedule_latencies(Schedule(T0, 1000), range(7), outputs)[1] == [0, 3, 4, 5]


def test_summary():
    assert latency_summary([]) == {"count": 0}
    got = latency_summary([float(v) for v in range(100, 0, -1)])
    assert got == {"count": 100, "p50": 50.0, "p99": 99.0, "max": 100.0}
