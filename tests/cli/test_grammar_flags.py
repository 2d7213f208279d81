"""The grammar limits as launcher flags with env twins, and where they go (the router's check
and the engine's compiles); `--disable-grammar-support` keeps the engine's grammar off."""

from __future__ import annotations

import pytest

from pytgi.cli import configs
from pytgi.cli.main import build_parser, launcher_main
from pytgi.config import GrammarConfig, ModelConfig


def serve_args(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_defaults_are_grammar_config_defaults():
    args = serve_args()
    assert configs.grammar_config(args) == GrammarConfig()
    assert configs.engine_config(args, ModelConfig("m")).grammar == GrammarConfig()


def test_flags_and_env_twins(monkeypatch):
    monkeypatch.setenv("MAX_GRAMMAR_BYTES", "1000")
    monkeypatch.setenv("GRAMMAR_MASK_THREADS", "2")
    args = serve_args(
        "--grammar-compile-timeout", "2.5",
        "--max-grammar-size", "5000",
        "--max-grammar-lexer-states", "700",
        "--grammar-compile-fuel", "9000",
        "--grammar-mask-fuel", "8000",
        "--grammar-compile-threads", "3",
        "--grammar-cache-size", "7",
        "--grammar-cache-bytes", "12345678",
    )  # fmt: skip
    assert configs.grammar_config(args) == GrammarConfig(
        compile_timeout_s=2.5,
        max_grammar_bytes=1000,
        max_grammar_size=5000,
        max_lexer_states=700,
        initial_lexer_fuel=9000,
        step_lexer_fuel=8000,
        compile_threads=3,
        mask_threads=2,
        cache_size=7,
        cache_bytes=12345678,
    )


def test_disable_grammar_support_turns_the_engine_side_off():
    args = serve_args("--disable-grammar-support")
    assert configs.engine_config(args, ModelConfig("m")).grammar is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grammar-compile-timeout", "0"], "`grammar_compile_timeout` must be > 0"),
        (["--grammar-mask-threads", "0"], "`mask_threads` must be >= 1"),
        (["--grammar-cache-bytes", "0"], "`cache_bytes` must be >= 1"),
    ],
)
def test_bad_limits_are_start_up_errors(flags, message, capsys):
    assert launcher_main(flags) == 1
    assert message in capsys.readouterr().err
