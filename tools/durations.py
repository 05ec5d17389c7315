"""Each test's seconds from one run, into the table make test's workers are balanced by.

    make durations          # runs the suite as make test does, then this script

reads the per-test seconds the run wrote (``ACCUMLIB_DURATIONS``, tests/_schedule.py), writes
tests/durations.json (each scheduling unit's total, a file or a browser test, rounded to 0.1 s) and prints
the slowest 20 tests as the markdown table docs/development.md shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _schedule import DURATIONS, unit_of  # noqa: E402  (tests/ is not a package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="the per-test seconds a run wrote (ACCUMLIB_DURATIONS)")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to print")
    args = parser.parse_args()
    seconds: dict[str, float] = json.loads(args.record.read_text())
    units: defaultdict[str, float] = defaultdict(float)
    for nodeid, s in seconds.items():
        units[unit_of(nodeid)] += s
    DURATIONS.write_text(json.dumps({u: round(s, 1) for u, s in sorted(units.items())}, indent=1) + "\n")
    total = sum(seconds.values())
    print(f"{len(seconds)} tests, {total / 60:.1f} min of test time in all; wrote {DURATIONS.name}\n")
    print("| test | seconds |\n|---|---|")
    for nodeid, s in sorted(seconds.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{nodeid}` | {s:.0f} |")


if __name__ == "__main__":
    main()
