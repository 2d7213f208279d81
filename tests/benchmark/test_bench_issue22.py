"""scripts/bench_issue22.py's own machinery, without llama.cpp: a server (a stand-in
llama-server that also starts a child) is started on a free port, measured (resident memory of
its process tree) and killed with its whole process group; the report puts the rounds of each
model x type in a table, flags measurements that other processes disturbed, and lists errors."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_issue22.py"

FAKE_SERVER = """#!{python}
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child to reap
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_issue22", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_server_is_measured_and_killed_with_its_children(bench, tmp_path):
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir()
    exe.write_text(FAKE_SERVER.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    tools = bench.Tools(exe.parent, tmp_path)
    server = bench.start_server("llama", tools, tmp_path / "m.gguf", 2, tmp_path / "s.log", 60)
    deadline = time.monotonic() + 10
    while not bench._descendants(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = [server.proc.pid, *bench._descendants(server.proc.pid)]
    assert len(tree) == 2
    rss = bench.rss_of(server)
    assert rss["rss_mib"] > 1 and rss["total_rss_mib"] > rss["rss_mib"]
    assert server.proc.pid in bench._GROUPS
    server.stop()
    assert server.proc.pid not in bench._GROUPS
    for pid in tree:  # the child went with the group
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                os.waitpid(pid, os.WNOHANG)  # only the server is our child
            except ChildProcessError:
                pass
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_a_server_that_exits_is_an_error_not_a_hang(bench, tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError, match="exited"):
        bench.start_server("llama", bench.Tools(tmp_path, tmp_path), tmp_path / "m.gguf", 2,
                           tmp_path / "s.log", 60)  # fmt: skip
    assert not bench._GROUPS


def test_the_others_meter_counts_cores(bench):
    with bench.OthersMeter() as meter:
        time.sleep(0.2)
    assert meter.cores is not None and 0 <= meter.cores <= (os.cpu_count() or 1) + 0.5


def test_report_lists_rounds_ratios_flags_and_errors(bench):
    def http(tok_s, ttft, flag=False):
        return {"output_tok_s": tok_s, "ttft_p50_ms": ttft, "others_flag": flag}

    round1 = {
        "anchor": {"tg128_tok_s": 100.0, "pp512_tok_s": 900.0, "others_flag": False},
        "engine": {"decode_tok_s": 120.0, "decode_bw_fraction": 0.61, "others_flag": True},
        "pytgi": {"http1": http(110.0, 30), "http16": http(300.0, 800),
                  "prefill512": http(0, 400), "rss_after": {"rss_mib": 700.0}},
        "llama": {"http1": http(100.0, 40), "http16": http(200.0, 900),
                  "prefill512": http(0, 600), "rss_after": {"rss_mib": 500.0}},
    }  # fmt: skip
    round2 = {"pytgi": {"error": "pytgi server exited (1)"}}
    results = {
        "started_at": "now",
        "plan_name": "quick",
        "threads": 2,
        "plan": {"output_tokens": 128},
        "cases": [{"model": "smollm2", "type": "Q4_0", "rounds": [round1, round2]}],
    }
    text = bench.report(results)
    rows = [line for line in text.splitlines() if line.startswith("| smollm2")]
    assert len(rows) == 2
    assert "120.0 (1.20×) ⚠" in rows[0]  # engine ÷ tg128, disturbed
    assert "110.0 / 100.0 (1.10×)" in rows[0] and "300.0 / 200.0 (1.50×)" in rows[0]
    assert "400 / 600 (1.50×)" in rows[0]  # prefill TTFT: llama ÷ pytgi
    assert "700 / 500" in rows[0]
    assert "- smollm2 Q4_0 pytgi: pytgi server exited (1)" in text
