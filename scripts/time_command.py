"""Run a command and write how long it took, and what it said at the end, as a results file.

    .venv/bin/python scripts/time_command.py --json docs/results/ci.json -- bash .ci/run
    .venv/bin/python scripts/time_command.py --json FILE --summary 'passed' -- CMD ...

The command's output passes through unchanged. The results file (``docs/results/<name>.json``
for the published figures, rendered by ``scripts/render_docs.py``) holds the exit code, the wall
time, the CPU time and the peak RSS of the command and its children, the last output line that
matches ``--summary`` (a regular expression, e.g. pytest's ``N passed`` line) and the provenance
(``precision_plugin._base.provenance``) naming the command as given. A failing command is still
recorded, with its exit code; this script exits with the command's code.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import time

from precision_plugin._base.provenance import write_results


def run(command: list[str], summary: str | None) -> dict[str, object]:
    """Run ``command``, echoing its output; return its timing and its last summary line."""
    pattern = re.compile(summary) if summary else None
    last = None
    start = time.monotonic()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            if pattern is not None and pattern.search(line):
                last = line.strip()
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "returncode": process.returncode,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # the largest single child (Linux: KiB)
        "summary": last,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse, run, write the results file; exit with the command's code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", required=True, help="the results file to write")
    parser.add_argument("--summary", metavar="REGEX", help="keep the last output line matching it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: put it after --, e.g. -- bash .ci/run")
    data = run(command, args.summary)
    write_results(args.json, data, command)
    print(f"wrote {args.json} ({data['wall_seconds']:.0f} s, exit code {data['returncode']})")
    return int(data["returncode"])  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
