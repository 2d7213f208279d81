"""Start-up warnings for settings that would otherwise cost silently: a half-precision --dtype on
a CPU without that type's matrix instructions."""

from __future__ import annotations

from pytgi.cli.startup_notes import cpu_flags, warn_slow_dtype


def test_half_dtype_without_matrix_instructions_warns(caplog):
    assert warn_slow_dtype("bfloat16", "cpu", flags={"avx2", "avx512f"})
    assert "--dtype bfloat16 on a CPU without amx_bf16 or avx512_bf16" in caplog.text
    assert warn_slow_dtype("float16", "cpu", flags={"avx512_bf16"})


def test_no_warning_where_half_precision_is_fast_or_not_asked():
    assert not warn_slow_dtype("bfloat16", "cpu", flags={"avx512_bf16"})
    assert not warn_slow_dtype("float16", "cpu", flags={"amx_fp16"})
    assert not warn_slow_dtype("float32", "cpu", flags=set())
    assert not warn_slow_dtype(None, "cpu", flags=set())
    assert not warn_slow_dtype("bfloat16", "cuda", flags=set())


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
