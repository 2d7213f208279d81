"""SUMMARY.md of a GPU validation run (scripts/gpu_validate.sh): phase times, the gpu tests'
outcome and measured figures, and the benchmark's headline numbers with CUDA graphs on and off.

    python scripts/gpu_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def number(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def test_lines(out: Path) -> list[str]:
    junit = out / "junit.xml"
    if not junit.exists():
        return ["", "## gpu tests", "", "no junit.xml: the test phase did not finish (tests.log)"]
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    counts = ", ".join(f"{key} {suite.get(key)}" for key in keys)
    lines = ["", "## gpu tests", "", counts, ""]
    for case in suite.iter("testcase"):
        bad = [e for e in case if e.tag in ("failure", "error")]
        if bad:
            message = (bad[0].get("message") or "").replace("\n", " ")[:400]
            lines.append(f"- FAILED {case.get('classname')}::{case.get('name')}: {message}")
    return lines


def figure_lines(out: Path) -> list[str]:
    """What the tests measured (tests/backends/cuda/gpu.py: record)."""
    lines = []
    for path in sorted((out / "tests").glob("*.json")):
        lines += ["", f"### {path.stem}", "", "```json", path.read_text().strip(), "```"]
    return lines


def bench_lines(out: Path) -> list[str]:
    lines = []
    for name in ("graphs", "eager"):
        path = out / f"bench_{name}.json"
        if not path.exists():
            continue
        lines += ["", f"## bench, CUDA graphs {'on' if name == 'graphs' else 'off'}", ""]
        for case in json.loads(path.read_text())["cases"]:
            ours = case["summary"]["pytgi"]
            bandwidth = number(case["roofline"]["bandwidth_gb_s"], 0)
            row = (
                f"- {case['workload']}: {number(ours['output_tok_s'], 0)} output tok/s, decode "
                f"step {number(ours['decode_step_ms'])} ms, weight bytes / step / copy bandwidth "
                f"{number(ours['decode_bw_fraction'])} ({bandwidth} GB/s)"
            )
            for baseline, ratio in case["ratios"].items():
                row += f"; x{number(ratio['output_tok_s'])} output tok/s vs {baseline}"
            lines.append(row)
    return lines


def main(out: Path) -> None:
    phases = (out / "phases.txt").read_text().strip() if (out / "phases.txt").exists() else ""
    lines = ["# GPU validation", "", "```", phases, "```", *test_lines(out), *figure_lines(out)]
    lines += bench_lines(out)
    (out / "SUMMARY.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
