"""Log formats: a tensor-parallel rank's lines carry the rank (text and JSON)."""

from __future__ import annotations

import json
import logging

from pytgi.utils.logging import formatter


def _record() -> logging.LogRecord:
    return logging.LogRecord("pytgi.worker", logging.INFO, __file__, 1, "loaded", None, None)


def test_rank_prefix_on_text_lines():
    assert "[rank 2] " in formatter(rank=2).format(_record())
    assert "[rank" not in formatter().format(_record())


def test_rank_field_in_json_lines():
    assert json.loads(formatter(json_output=True, rank=1).format(_record()))["rank"] == 1
    assert "rank" not in json.loads(formatter(json_output=True).format(_record()))
