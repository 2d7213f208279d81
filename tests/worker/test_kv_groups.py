"""The memory plan of a model mixing windowed and full layers (the tiny Gemma 3, window 24): the
window group gets the blocks its running requests' windows and a step's tokens can need
(worker/kv_groups.py), the full group the rest of the budget, and each layer's cache its group's
block count."""

from __future__ import annotations

from models.runner_utils import engine_config

from pytgi.backends.selector import select_platform
from pytgi.config import CacheConfig, SchedulerConfig
from pytgi.envs import device_config
from pytgi.worker.kv_groups import window_group_blocks
from pytgi.worker.model_runner import ModelRunner

BUDGET = 1 << 20


def runner_for(model_dir, max_batch_size: int | None) -> ModelRunner:
    config = engine_config(model_dir)
    config = type(config)(
        model=config.model,
        cache=CacheConfig(block_size=4, max_kv_cache_bytes=BUDGET),
        scheduler=SchedulerConfig(max_batch_prefill_tokens=64, max_batch_size=max_batch_size),
    )
    runner = ModelRunner(config, select_platform(device_config()))
    runner.load_model(model_dir)
    return runner


def test_the_window_group_gets_its_need_and_the_full_group_the_rest(tiny_model_factory):
    runner = runner_for(tiny_model_factory("gemma3"), max_batch_size=2)
    assert runner.kv_group_windows == (None, 24)
    full_bytes, window_bytes = runner.group_bytes_per_block
    assert full_bytes + window_bytes == runner.bytes_per_block
    num_full = runner.profile_num_blocks()
    groups = runner.group_num_blocks(num_full)
    assert groups == (num_full, 2 * (6 + 2) + 64 // 4)  # cdiv(23, 4) = 6
    used = num_full * full_bytes + groups[1] * window_bytes
    assert BUDGET - full_bytes < used <= BUDGET  # every byte the full group can use
    assert num_full > BUDGET // runner.bytes_per_block  # more tokens fit than in one group
    runner.allocate_kv_cache(groups)
    for name, (k, v) in runner.kv_caches.items():
        assert k.shape[1] == v.shape[1] == groups[runner.layer_groups[name]] * 4


def test_a_window_group_never_outgrows_the_full_one(tiny_model_factory):
    """128 running requests' windows need more than the budget's equal split: both groups get
    the single-group count (the memory is split as one group would split it)."""
    runner = runner_for(tiny_model_factory("gemma3"), max_batch_size=None)
    num_full = runner.profile_num_blocks()
    assert window_group_blocks(24, 4, None, 64) > num_full
    assert num_full == BUDGET // runner.bytes_per_block
    assert runner.group_num_blocks(num_full) == (num_full, num_full)


def test_models_whose_layers_agree_have_one_group(tiny_model_factory):
    for arch, windows in (("llama", (None,)), ("mistral", (24,))):
        runner = runner_for(tiny_model_factory(arch), max_batch_size=2)
        assert runner.kv_group_windows == windows
        num_blocks = runner.profile_num_blocks()
        assert num_blocks == BUDGET // runner.bytes_per_block
        assert runner.group_num_blocks(num_blocks) == (num_blocks,)
