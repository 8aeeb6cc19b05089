"""Log output of the coordinator and the agent: text (default) or JSON lines (``--log-format``).

In JSON every record is one object on one line: ``time`` (UTC, ISO 8601),
``level``, ``logger``, ``message`` (the formatted text, the same as the text
format's), then the fields the call passed with ``extra=`` (a quorum change
carries ``event``, ``job``, ``quorum_id``, ``members`` and ``reason``), and
``exception`` with the traceback when there is one. A log shipper can index
the fields without parsing the message.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

from fthsdp.core.errors import ConfigError

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def check_log_format(value: str) -> None:
    if value not in FORMATS:
        raise ConfigError(f"--log-format must be {' or '.join(FORMATS)}, got {value!r}")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """One handler on the root logger, on stderr, in ``log_format``."""
    check_log_format(log_format)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
