"""tests/helpers/kafka.py's cluster ids: Kafka's StorageTool takes an id starting with '-'
for an option and refuses to format (one draw in 64 did, and failed a CI run)."""
import re

import kafka


def test_cluster_ids_are_kafka_uuids_that_no_parser_takes_for_an_option():
    ids = [kafka.new_cluster_id() for _ in range(2000)]   # ~31 would start with '-' unchecked
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids), \
        [i for i in ids if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i)][:5]
    assert len(set(ids)) == len(ids)
