"""Probe /health while `pytgi bench` saturates a server: shows the HTTP loop never waits for the
engine.

python scripts/health_under_load.py --url http://127.0.0.1:3000 --         --tokenizer-name
pytgi/demo_model --concurrency 32 --max-requests 96 --no-plots

Everything after `--` is passed to `pytgi bench --url URL`. Prints /health latency percentiles (and
how many probes failed) measured during the load, next to the bench's own report.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import httpx


def probe(url: str, stop: threading.Event, latencies_ms: list[float], failures: list[str]) -> None:
    with httpx.Client(timeout=10.0) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                response = client.get(f"{url}/health")
                if response.status_code != 200:
                    failures.append(f"status {response.status_code}")
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
            latencies_ms.append((time.perf_counter() - start) * 1000)
            time.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--url", required=True)
    args, bench_args = parser.parse_known_args()
    bench_args = [a for a in bench_args if a != "--"]
    stop, latencies, failures = threading.Event(), [], []
    thread = threading.Thread(target=probe, args=(args.url, stop, latencies, failures))
    thread.start()
    cmd = [sys.executable, "-m", "pytgi", "bench", "--url", args.url, *bench_args]
    code = subprocess.call(cmd)
    stop.set()
    thread.join()
    print(f"\n/health during the load: {len(latencies)} probes, {len(failures)} failed")
    for q in (50, 90, 99, 100):
        print(f"  p{q}: {percentile(latencies, q):.1f} ms")
    return code


if __name__ == "__main__":
    sys.exit(main())
