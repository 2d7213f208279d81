"""How busy the rest of the machine was during a measurement (the machine is shared).

`others` = CPU time used by every other process (plus hypervisor steal) ÷ (cores × wall time), from
/proc/stat minus this process's own CPU time: 0.5 on a 2-core machine means one full core was busy
elsewhere. Contention only slows a run down, so a high value marks a pessimistic number.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# /proc/stat cpu columns: user nice system idle iowait irq softirq steal (guest time is in user)
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuSnapshot:
    wall_s: float
    machine_busy_s: float | None  # None where /proc/stat is unavailable
    own_cpu_s: float


def snapshot() -> CpuSnapshot:
    times = os.times()
    return CpuSnapshot(time.perf_counter(), _machine_busy_s(), times.user + times.system)


def others_fraction(start: CpuSnapshot, end: CpuSnapshot) -> float | None:
    """Share of the whole machine used by other processes between two snapshots (0..1)."""
    wall_s = end.wall_s - start.wall_s
    if start.machine_busy_s is None or end.machine_busy_s is None or wall_s <= 0:
        return None
    busy_s = end.machine_busy_s - start.machine_busy_s
    own_s = end.own_cpu_s - start.own_cpu_s
    cores = os.cpu_count() or 1
    return min(1.0, max(0.0, (busy_s - own_s) / (cores * wall_s)))


def _machine_busy_s() -> float | None:
    if not PROC_STAT.exists():
        return None
    fields = PROC_STAT.read_text().splitlines()[0].split()[1:]
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in _BUSY_COLUMNS if i < len(fields)) / ticks_per_s
