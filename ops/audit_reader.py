"""`kubectl gpupack decisions`: read the audit log back as a table or JSON.

Reads audit lines from files or stdin (so `kubectl logs deploy/gpupack-webhook | ...`
works, `--prefix` output included), ignores every other line, filters by namespace,
workload, outcome, reason and time, and prints a readable table or JSON lines.
"""

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TextIO

from gpupack.objects import JSON
from ops.explain import open_input
from webhook.audit import AUDIT_MARKER
from webhook.decision import Outcome

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
COLUMNS = (
    ("TIME", "time"),
    ("NAMESPACE", "namespace"),
    ("POD", "pod"),
    ("WORKLOAD", "workload"),
    ("OUTCOME", "outcome"),
    ("REASON", "reason"),
    ("POLICY", "policy"),
    ("COMPUTE", "compute"),
    ("MEMORY", "memory"),
    ("CAPACITY", "capacity"),
)


def _time_arg(text: str) -> datetime:
    match = _DURATION.match(text)
    if match:
        return datetime.now(UTC) - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a duration (30s, 10m, 2h, 1d) or an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_lines(lines: Iterable[str]) -> Iterator[JSON]:
    """Audit records among arbitrary log lines (a `kubectl logs --prefix` prefix is fine)."""
    for line in lines:
        start = line.find("{")
        if start < 0 or AUDIT_MARKER not in line:
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("audit") == AUDIT_MARKER:
            yield record


@dataclass(frozen=True, slots=True)
class Filter:
    namespace: str | None = None
    workload: str | None = None
    outcome: str | None = None
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, record: JSON) -> bool:
        if self.namespace and record.get("namespace") != self.namespace:
            return False
        if self.outcome and record.get("outcome") != self.outcome:
            return False
        if self.reason and record.get("reason") != self.reason:
            return False
        if self.workload:
            kind, _, name = self.workload.rpartition("/")
            if record.get("ownerName") != name or (kind and record.get("ownerKind") != kind):
                return False
        if self.since or self.until:
            try:
                moment = datetime.fromisoformat(str(record.get("time")))
            except ValueError:
                return False
            if self.since and moment < self.since:
                return False
            if self.until and moment >= self.until:
                return False
        return True


def _cell(record: JSON, field: str) -> str:
    if field == "workload":
        kind, name = record.get("ownerKind") or "", record.get("ownerName") or ""
        return f"{kind}/{name}" if kind else "-"
    if field == "pod":
        return str(record.get("pod") or record.get("generateName") or "-")
    if field == "capacity":
        capacity = record.get("capacity") or {}
        action = str(capacity.get("action") or "-")
        if action == "needed":  # GPUs the pool lacks, which gpupack-scheduler creates
            return f"needed:{capacity.get('missing', '?')}"
        created = capacity.get("created") or []  # lines of versions whose webhook created
        return f"{action}:{len(created)}" if created else action
    if field == "time":
        return str(record.get("time", ""))[:19].replace("T", " ")
    value = record.get(field)
    return "-" if value in (None, "") else str(value)


def write_rows(rows: list[list[str]], out: TextIO) -> None:
    """Rows as aligned columns, the first row the header: how every gpupack table looks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


def table(records: list[JSON], out: TextIO) -> None:
    rows = [[title for title, _ in COLUMNS]]
    rows += [[_cell(record, field) for _, field in COLUMNS] for record in records]
    write_rows(rows, out)


def add_filters(parser: argparse.ArgumentParser) -> None:
    """The filters and the output format, without the files (`kubectl gpupack decisions`
    reads the webhook pods' logs instead)."""
    parser.add_argument("-w", "--workload", help="only this workload: NAME or KIND/NAME")
    parser.add_argument("--outcome", choices=[o.value for o in Outcome], help="only this outcome")
    parser.add_argument("--reason", help="only this reason, e.g. no-gpu or opted-out")
    parser.add_argument(
        "--since", type=_time_arg, help="only at or after: 30m, 2h, 1d or an ISO time"
    )
    parser.add_argument(
        "--until", type=_time_arg, help="only before: a duration ago or an ISO time"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def selection(args: argparse.Namespace) -> Filter:
    return Filter(args.namespace, args.workload, args.outcome, args.reason, args.since, args.until)


def show(records: list[JSON], output: str) -> None:
    """Print `records` as a table, or as JSON lines."""
    if output == "json":
        for record in records:
            sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    elif records:
        table(records, sys.stdout)
    else:
        print("no decisions matched", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    selected = selection(args)
    records: list[JSON] = []
    sources = args.files or ["-"]
    for source in sources:
        try:
            stream = open_input(source)
        except OSError as exc:
            print(
                f"kubectl gpupack decisions: cannot read {source}: {exc.strerror}", file=sys.stderr
            )
            return 2
        with stream:
            records.extend(r for r in parse_lines(stream) if selected.matches(r))
    show(records, args.output)
    return 0
