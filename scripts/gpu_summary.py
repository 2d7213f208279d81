"""SUMMARY.md and junit.xml of a GPU validation run (scripts/gpu_validate.sh): phase times, both
test phases' outcomes (their junit files merged into one) and measured figures, and the
benchmark's headline numbers.

    python scripts/gpu_summary.py OUT_DIR [WORK_DIR]   # WORK_DIR: the run's scratch (default OUT)
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def number(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


JUNIT_PARTS = ("junit_features.xml", "junit_tests.xml")


def merge_junit(out: Path, work: Path) -> ET.Element | None:
    """The test phases' junit files -> one <testsuites> written to OUT/junit.xml."""
    merged = ET.Element("testsuites")
    for name in JUNIT_PARTS:
        path = work / name
        if not path.exists():
            continue
        root = ET.parse(path).getroot()
        for suite in [root] if root.tag == "testsuite" else root.findall("testsuite"):
            suite.set("name", name.removesuffix(".xml"))
            merged.append(suite)
    if not len(merged):
        return None
    ET.ElementTree(merged).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)
    return merged


def test_lines(merged: ET.Element | None) -> list[str]:
    if merged is None:
        return ["", "## gpu tests", "", "no junit file: no test phase finished (gpu.log)"]
    lines = ["", "## gpu tests"]
    keys = ("tests", "failures", "errors", "skipped")
    for suite in merged:
        counts = ", ".join(f"{key} {suite.get(key)}" for key in keys)
        lines += ["", f"{suite.get('name')}: {counts}", ""]
        for case in suite.iter("testcase"):
            bad = [e for e in case if e.tag in ("failure", "error")]
            if bad:
                message = (bad[0].get("message") or "").replace("\n", " ")[:400]
                lines.append(f"- FAILED {case.get('classname')}::{case.get('name')}: {message}")
    return lines


def figure_lines(work: Path) -> list[str]:
    """What the tests measured (tests/backends/cuda/gpu.py: record)."""
    lines = []
    for path in sorted((work / "tests").glob("*.json")):
        lines += ["", f"### {path.stem}", "", "```json", path.read_text().strip(), "```"]
    return lines


def bench_lines(work: Path) -> list[str]:
    lines = []
    for name in ("graphs", "eager"):
        path = work / f"bench_{name}.json"
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


def main(out: Path, work: Path) -> None:
    phases = (out / "phases.txt").read_text().strip() if (out / "phases.txt").exists() else ""
    merged = merge_junit(out, work)
    lines = ["# GPU validation", "", "```", phases, "```", *test_lines(merged)]
    lines += figure_lines(work) + bench_lines(work)
    (out / "SUMMARY.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]))
