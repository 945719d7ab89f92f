"""transformWithState with its state on the tier: Spark's scenarios (value, list and map
state, timers in both time modes, TTLs, initial state, deleteIfExists, restarts) run again
with a memory budget and no state kept in memory between batches, so every batch loads the
keys it touches from local disk and finds due timers and TTLs through the tier's indexes.
Spark's own operator is the oracle, as in the modules these come from (each test runs
under its own module's settings)."""
import pytest

import test_transform_with_state as basics
import test_tws_spark_scenarios as scenarios
import test_tws_spark_scenarios_time as timed
from test_transform_with_state import (  # noqa: F401  (collected here again)
    test_a_state_variable_added_then_removed_between_runs, test_event_time_timers,
    test_processing_time_timers, test_state_variables_with_ttl,
    test_value_list_and_map_state)
from test_tws_spark_scenarios import (  # noqa: F401
    test_basic_running_state_across_a_restart, test_composite_types_in_state_and_output,
    test_delete_if_exists_in_init, test_non_contiguous_grouping_columns,
    test_state_variable_tour)
from test_tws_spark_scenarios_time import (  # noqa: F401
    test_chaining_after_event_time, test_initial_state, test_ttl_expiry, test_ttl_tour)

MODULE_SETTINGS = {basics.__name__: basics.rocksdb, scenarios.__name__: scenarios.rocksdb,
                   timed.__name__: timed.spark_test_conf}


@pytest.fixture(autouse=True)
def state_on_disk(request, spark_conf, tmp_path):
    MODULE_SETTINGS[request.function.__module__].__wrapped__(spark_conf)
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(tmp_path / "local")})
