"""--disable-playground and its env twin reach ServerConfig.playground."""

from __future__ import annotations

import argparse

from pytgi.cli.configs import server_config
from pytgi.cli.flags import SERVE_FLAGS, add_flags
from pytgi.config import LimitsConfig


def _config(argv, monkeypatch, env=None):
    monkeypatch.delenv("DISABLE_PLAYGROUND", raising=False)
    if env is not None:
        monkeypatch.setenv("DISABLE_PLAYGROUND", env)
    parser = argparse.ArgumentParser()
    add_flags(parser, SERVE_FLAGS)
    return server_config(parser.parse_args(argv), LimitsConfig(), "m", None)


def test_on_by_default(monkeypatch):
    assert _config([], monkeypatch).playground is True


def test_flag_and_env_turn_it_off(monkeypatch):
    assert _config(["--disable-playground"], monkeypatch).playground is False
    assert _config([], monkeypatch, env="true").playground is False
    assert _config([], monkeypatch, env="false").playground is True
