"""A live progress bar per step (tqdm on stderr), or none for tests and piped output."""

from __future__ import annotations

import sys
import time
from typing import Protocol

from pytgi.benchmark.http.records import RequestResult


class Progress(Protocol):
    def start(self, label: str, total: int, duration_s: float) -> None: ...

    def update(self, result: RequestResult) -> None: ...

    def close(self) -> None: ...


class NoProgress:
    def start(self, label: str, total: int, duration_s: float) -> None:
        pass

    def update(self, result: RequestResult) -> None:
        pass

    def close(self) -> None:
        pass


class TqdmProgress:
    """Counts measured requests against the step's bound; shows failures and time left."""

    def __init__(self) -> None:
        self._bar = None
        self._num_failed = 0
        self._deadline_s = 0.0

    def start(self, label: str, total: int, duration_s: float) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, desc=f"{label:>12}", unit="req", file=sys.stderr, disable=None
        )  # disable=None: no bar when stderr is not a terminal (CI logs)
        self._num_failed = 0
        self._deadline_s = time.monotonic() + duration_s

    def update(self, result: RequestResult) -> None:
        if self._bar is None:
            return
        self._num_failed += not result.ok
        time_left_s = max(0.0, self._deadline_s - time.monotonic())
        self._bar.set_postfix(failed=self._num_failed, left=f"{time_left_s:.0f}s", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
