"""Command line: `python -m arrowstate {jar,build,demo,version}`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arrowstate")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jar", help="print the shim jar's path (for spark-submit --jars)")
    sub.add_parser("build", help="compile the JVM shim jar against the installed Spark")
    sub.add_parser("demo", help="run a short deduplicating query on local Spark")
    sub.add_parser("version", help="print the version")
    args = parser.parse_args(argv)

    from . import __version__
    from .shim import build_jar, jar_path

    if args.command == "jar":
        print(jar_path())
    elif args.command == "build":
        print(build_jar())
    elif args.command == "version":
        print(__version__)
    elif args.command == "demo":
        from .demo import run_demo

        run_demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
