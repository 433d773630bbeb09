"""Structured logs: one JSON object per line, the same for every gpupack binary."""

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


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Structured logs for the server's own messages (uvicorn's included) on stderr."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
