"""A JSON log formatter that keeps django_dispatch's ``dispatch_*`` fields as fields.

Any JSON formatter that writes a record's ``extra`` attributes does the same
(python-json-logger, structlog's ``ProcessorFormatter``); this one needs no
package and is what the documented ``LOGGING`` example uses::

    "formatters": {"json": {"()": "django_dispatch.observability.logs.JSONFormatter"}}

One line per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
``message``, every ``dispatch_*`` attribute of the record and, when the
record has one, ``exception`` (the formatted traceback).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name.startswith("dispatch_"):
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)
