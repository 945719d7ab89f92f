"""Command line: `python -m arrowstate {jar,build,demo,version,state ...}`."""
from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .demo import run_demo
from .shim import build_jar, jar_path
from .spark_home import SparkHomeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arrowstate")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jar", help="print the shim jar's path (for spark-submit --jars)")
    sub.add_parser("build", help="compile the JVM shim jar against the installed Spark")
    sub.add_parser("demo", help="run a short deduplicating query on local Spark")
    sub.add_parser("version", help="print the version")
    state = sub.add_parser(
        "state", help="a checkpoint's state, offline (on the local disk, or any filesystem "
                      "Hadoop reaches: hdfs://, s3a:// ...)")
    state_sub = state.add_subparsers(dest="state_command", required=True)
    # every state command: the settings of the Spark it starts (spark-defaults.conf and
    # PYSPARK_SUBMIT_ARGS apply too, as pyspark reads them)
    spark_settings = argparse.ArgumentParser(add_help=False)
    spark_settings.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a setting of the Spark the command starts (export, import, repartition; "
             "describe and history for a checkpoint off the local disk), as spark-submit's "
             "--conf: the filesystem's (spark.hadoop.fs.s3a.endpoint=...), its jars "
             "(spark.jars.packages=org.apache.hadoop:hadoop-aws:3.5.0); repeatable")
    describe = state_sub.add_parser(
        "describe", parents=[spark_settings],
        help="per stateful operator: family, engine, partitions, newest version, rows, bytes "
             "on disk, key and value schema")
    describe.add_argument("checkpoint")
    describe.add_argument("--json", action="store_true", help="print JSON, for scripts")
    hist = state_sub.add_parser(
        "history", parents=[spark_settings],
        help="per committed batch and stateful operator: state rows (total, updated, "
             "removed), bytes on disk and the batch's duration")
    hist.add_argument("checkpoint")
    hist.add_argument("--json", action="store_true", help="print JSON, for scripts")
    hist.add_argument("--plot", metavar="FILE.png",
                      help="also draw rows, bytes and duration over the batches into a PNG "
                           "(needs the plot extra: pip install 'arrowstate[plot]')")
    export = state_sub.add_parser(
        "export", parents=[spark_settings],
        help="convert the state of a stopped query's checkpoint to the format of the Spark "
             "state store it records (HDFS-backed or RocksDB), to continue without arrowstate")
    export.add_argument("checkpoint")
    export.add_argument("--operator", type=int, help="convert this operator's state only")
    export.add_argument("--planning-batch", type=int, metavar="N",
                        help="the query is planning batch N (its offsets written, not its "
                             "commit): how the shim converts when a query leaves arrowstate "
                             "(in its driver, through the py4j gateway PYSPARK_GATEWAY_PORT "
                             "names, if set)")
    imp = state_sub.add_parser(
        "import", parents=[spark_settings],
        help="convert the Spark state store (HDFS-backed or RocksDB) state of a stopped "
             "query's checkpoint to arrowstate's format, to continue on arrowstate")
    imp.add_argument("checkpoint")
    imp.add_argument("--time-zone", help="the session time zone the query runs with "
                                         "(default: this machine's)")
    rep = state_sub.add_parser(
        "repartition", parents=[spark_settings],
        help="repartition the arrowstate state of a stopped query's checkpoint into N "
             "partitions (as Spark 4.3's repartition does for RocksDB)")
    rep.add_argument("checkpoint")
    rep.add_argument("partitions", type=int)
    rep.add_argument("--time-zone", help="the session time zone the query runs with "
                                         "(default: this machine's)")
    args = parser.parse_args(argv)

    if args.command == "state":
        from . import spark_state   # pyarrow and numpy: not for `jar`, `build` or `version`
        plot = getattr(args, "plot", None)
        spark_conf = {}
        for setting in args.conf:
            key, is_set, value = setting.partition("=")
            if not is_set or not key:
                parser.error(f"--conf {setting}: not KEY=VALUE")
            spark_conf[key] = value
        try:
            if plot is not None:   # before any work: without the extra, nothing is done
                spark_state.require_plotting()
            result = spark_state.state_command(args.state_command, args.checkpoint,
                                               getattr(args, "partitions", None),
                                               getattr(args, "time_zone", None),
                                               getattr(args, "operator", None),
                                               getattr(args, "planning_batch", None),
                                               spark_conf)
            if plot is not None:
                spark_state.plot_history(result, plot)
        except spark_state.CheckpointError as e:
            print(f"arrowstate: {e}", file=sys.stderr)
            return 2
        formats = {"describe": spark_state.format_text, "history": spark_state.format_history}
        text = args.state_command in formats and not args.json
        print(formats[args.state_command](result) if text else json.dumps(result, indent=2))
        if plot is not None:
            print(f"plot written to {plot}", file=sys.stderr)
        return 0

    try:
        if args.command == "jar":
            print(jar_path())
        elif args.command == "build":
            print(build_jar())
        elif args.command == "version":
            print(__version__)
        elif args.command == "demo":
            run_demo()
    except SparkHomeError as e:   # no usable Spark: the reason, not a traceback
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
