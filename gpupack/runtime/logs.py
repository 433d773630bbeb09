"""Logs on stderr, the same for every gpupack binary: one JSON object per line (the
default, for log pipelines), or `--log-format=text` for a person reading a terminal
(`time level logger: message key=value ...`)."""

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

# LogRecord attributes that are not "extra" fields.
_RECORD_FIELDS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "color_message"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update((k, v) for k, v in vars(record).items() if k not in _RECORD_FIELDS)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """`2026-11-23T10:00:00.123Z info webhook.tls: message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _RECORD_FIELDS)
        line = f"{moment.replace('+00:00', 'Z')} {record.levelname.lower()} {record.name}: "
        line += record.getMessage() + (f" {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


LOG_FORMATS: Final = ("json", "text")


def configure_logging(level: str, stream: TextIO | None = None, fmt: str = "json") -> None:
    """Logs for the process's own messages (uvicorn's included) on stderr."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(TextFormatter() if fmt == "text" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
