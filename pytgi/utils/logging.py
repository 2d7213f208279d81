"""Logging set-up: plain text or one JSON object per line (`--json-output`), same format in every
process. A tensor-parallel rank's lines carry its rank (`[rank N]` in text, `"rank"` in JSON).
"""

from __future__ import annotations

import json
import logging
import sys
import time

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


class JsonFormatter(logging.Formatter):
    def __init__(self, rank: int | None = None):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "target": record.name,
            "fields": {"message": record.getMessage()},
        }
        if self.rank is not None:
            entry["rank"] = self.rank
        if record.exc_info:
            entry["fields"]["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def formatter(json_output: bool = False, rank: int | None = None) -> logging.Formatter:
    if json_output:
        return JsonFormatter(rank)
    prefix = "" if rank is None else f"[rank {rank}] "
    return logging.Formatter(prefix + TEXT_FORMAT, DATE_FORMAT)


def setup_logging(json_output: bool = False, level: str = "INFO", rank: int | None = None) -> None:
    """`rank`: set in tensor-parallel processes (None when the model is not sharded)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(json_output, rank))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
