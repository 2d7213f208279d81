"""--cuda-graphs / --cuda-memory-fraction / PYTGI_DEVICE -> the device config, as TGI parses them
(`0` entries dropped, so `--cuda-graphs 0` means eager; the default list 1,2,4,8,16,32)."""

from __future__ import annotations

import pytest

from pytgi.cli.configs import engine_config, model_config
from pytgi.cli.main import build_parser, launcher_main
from pytgi.config import DEFAULT_CUDA_GRAPHS


def device(argv: list[str]):
    args = build_parser().parse_args(["serve", *argv])
    return engine_config(args, model_config(args)).device


@pytest.mark.parametrize(
    ("argv", "graphs"),
    [([], DEFAULT_CUDA_GRAPHS), (["--cuda-graphs", "0"], ()),
     (["--cuda-graphs", "1,4,0,8"], (1, 4, 8)), (["--cuda-graphs", "16"], (16,))],
)  # fmt: skip
def test_cuda_graphs_flag(argv, graphs):
    assert device(argv).cuda_graphs == graphs


def test_env_twins(monkeypatch):
    monkeypatch.setenv("CUDA_GRAPHS", "2,4")
    monkeypatch.setenv("CUDA_MEMORY_FRACTION", "0.5")
    monkeypatch.setenv("PYTGI_DEVICE", "CPU")
    config = device([])
    assert (config.cuda_graphs, config.cuda_memory_fraction, config.device) == ((2, 4), 0.5, "cpu")
    flags = device(["--cuda-graphs", "0", "--cuda-memory-fraction", "0.25"])
    assert (flags.cuda_graphs, flags.cuda_memory_fraction) == ((), 0.25)  # flags win


def test_unparsable_graph_list_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--cuda-graphs", "1,two"])
    assert "expected comma-separated batch sizes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [(["--cuda-memory-fraction", "1.5"], {}, "`cuda_memory_fraction` must be in (0, 1]"),
     (["--cuda-graphs", "-2"], {}, "`cuda_graphs` must be positive batch sizes"),
     ([], {"PYTGI_DEVICE": "gpu"}, "PYTGI_DEVICE must be one of auto, cpu, cuda, got 'gpu'")],
)  # fmt: skip
def test_bad_device_settings_stop_the_launcher(argv, env, message, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert launcher_main(argv) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "budget"),
    [({"PYTGI_DEVICE": "cuda"}, 4096), ({"PYTGI_DEVICE": "cpu"}, 1024),
     ({"CUDA_VISIBLE_DEVICES": ""}, 1024)],
)  # fmt: skip
def test_step_budget_follows_the_expected_platform(env, budget, monkeypatch):
    """TGI's 4096-token step on a GPU, the CPU's measured budget there (the API process guesses
    the platform without torch: a hidden GPU, or none, is the CPU)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["serve"])
    assert engine_config(args, model_config(args)).scheduler.max_batch_prefill_tokens == budget
