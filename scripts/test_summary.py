"""The closing table of ``bash scripts/dev.sh test``: one row per suite, from its reports.

    python scripts/test_summary.py REPORTS_DIR

``REPORTS_DIR`` holds ``suites`` (their names, in the order they ran), ``started`` (when the
run began, epoch seconds: the wall time printed after the table) and, per suite,
``NAME.status`` (its exit code and seconds, written by ``run_suite`` in scripts/dev.sh) and,
for a pytest suite, ``NAME.xml`` (its JUnit XML). Prints the table (suite, passed, failed,
skipped, minutes, the slowest tests), then which way the DeepSpeed fp16 branches ran (the
``deepspeed_fp16`` and ``deepspeed_fp16_refused`` properties the tests record); exits 1 if any
suite failed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: Properties tests record about the branch they ran (tests/integration/ds_cpu.py).
BRANCH_PROPERTIES = {
    "deepspeed_fp16": "DeepSpeed fp16 branch (the engine runs fp16)",
    "deepspeed_fp16_refused": "DeepSpeed refusing branch (no fp16 on the accelerator)",
}


def read_suite(status: Path) -> dict:
    """One suite's row: its exit code, minutes and, where it wrote JUnit XML, its counts."""
    rc, seconds = (int(x) for x in status.read_text().split())
    row = {"suite": status.stem, "rc": rc, "minutes": seconds / 60, "counts": None}
    row |= {"slowest": [], "branches": Counter()}
    xml = status.with_suffix(".xml")
    if not xml.is_file():
        return row
    counts, times = Counter(), []
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        times.append((float(case.get("time") or 0.0), name))
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        counts[outcome] += 1
        for prop in case.iter("property"):
            if prop.get("name") in BRANCH_PROPERTIES:
                row["branches"][(prop.get("name"), prop.get("value"))] += 1
    row["counts"] = counts
    row["slowest"] = [f"{name} {sec:.0f}s" for sec, name in sorted(times, reverse=True)[:3]]
    return row


def render(rows: list[dict]) -> str:
    """The table, as plain text that also reads as Markdown."""
    lines = [
        "| suite | passed | failed | skipped | minutes | slowest tests |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c = r["counts"]
        if c is None:  # not pytest: ok or failed as a whole
            passed, failed, skipped = ("ok", "", "") if r["rc"] == 0 else ("", "FAILED", "")
        else:
            passed, failed, skipped = c["passed"], c["failed"], c["skipped"]
            if r["rc"] not in (0,) and not c["failed"]:
                failed = f"exit {r['rc']}"  # e.g. a collection error or no test selected
        slowest = "; ".join(r["slowest"])
        lines.append(
            f"| {r['suite']} | {passed} | {failed} | {skipped} | {r['minutes']:.1f} | {slowest} |"
        )
    total = sum(r["minutes"] for r in rows)
    # A sum: suites run side by side (the contract lanes) overlap, so it can exceed the wall time.
    lines.append(f"| sum of suites | | | | {total:.1f} | |")
    branches = Counter()
    for r in rows:
        for (prop, value), n in r["branches"].items():
            branches[(prop, value, r["suite"])] += n
    for (prop, value, suite), n in sorted(branches.items()):
        lines.append(f"{BRANCH_PROPERTIES[prop]}: {n} tests in {suite}, {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table for the reports folder named in ``argv``; 1 if any suite failed."""
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0])
    names = (folder / "suites").read_text().split()  # in the order they ran
    rows = [read_suite(folder / f"{name}.status") for name in names]
    print("\n" + render(rows))
    started = folder / "started"
    if started.is_file():  # written by scripts/dev.sh test before its set-up
        import time

        minutes = (time.time() - int(started.read_text().split()[0])) / 60
        print(f"wall time, set-up included: {minutes:.1f} min")
    failed = [r["suite"] for r in rows if r["rc"] != 0]
    print(f"\nfailed suites: {', '.join(failed)}" if failed else "\nevery suite passed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
