"""transformWithState's planning on the driver: Spark learns a processor's state variables
by running its init() in Python against a state server of its own on the driver, which
records each variable the handle asks for (DriverStatefulProcessorHandleImpl). Spark starts
a new interpreter for it (a second of CPU importing pandas and pyspark, in a query run's
first batch); here a worker forked from the function daemon runs pyspark's own pre-init
against that same server, so the answers (schemas, errors) are Spark's.
"""
from __future__ import annotations

import base64
import json
from typing import Any


def run_pre_init(request: dict[str, Any]) -> None:
    """The processor's init() on a driver-side handle, as pyspark's driver worker runs it
    (TransformWithStateInPandasFuncMode.PRE_INIT, which also calls close())."""
    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient
    from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode
    from pyspark.sql.types import StructType

    udf, _ = CloudPickleSerializer().loads(base64.b64decode(request["command"]))
    server = request["stateServer"]
    client = StatefulProcessorApiClient(int(server) if server.isdigit() else server,
                                        StructType.fromJson(json.loads(request["keySchema"])))
    try:
        udf(client, TransformWithStateInPandasFuncMode.PRE_INIT, None, iter([]))
    finally:   # the server's connection ends with it: Spark's own ends with its process
        client.sockfile.close()
        client._client_socket.close()
