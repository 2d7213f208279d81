"""Walks every flag `pytgi serve` accepts, and every flag of TGI's launcher (and of TGI's llama.cpp
backend, which a CPU user of TGI types with a GGUF file), and holds each to one of:

- wired: given on the command line it changes the configs the engine and server are built from
  (checked here, in-process), or a named test drives it through the real server or CLI;
- refused: start-up ends with one line naming it (checked here);
- a documented no-op: docs/TGI_COMPATIBILITY.md lists it with the reason.

A flag added to the parser without a place in these tables fails the walk: no flag may be accepted
and ignored.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytgi.cli import configs
from pytgi.cli.flags import REFUSED_FLAGS
from pytgi.cli.main import build_parser, launcher_main
from pytgi.config import CacheInfo
from pytgi.errors import ConfigError

# the launcher points the root logger at the captured stderr (tests/cli/conftest.py)
pytestmark = pytest.mark.usefixtures("restore_logging")

ROOT = Path(__file__).resolve().parents[2]
COMPATIBILITY_DOC = ROOT / "docs" / "TGI_COMPATIBILITY.md"

# TGI's launcher (`text-generation-launcher --help`, 3.x)
TGI_LAUNCHER_FLAGS = """
--model-id --revision --validation-workers --sharded --num-shard --quantize --speculate --dtype
--kv-cache-dtype --trust-remote-code --max-concurrent-requests --max-best-of --max-stop-sequences
--max-top-n-tokens --max-input-tokens --max-input-length --max-total-tokens --waiting-served-ratio
--max-batch-prefill-tokens --max-batch-total-tokens --max-waiting-tokens --max-batch-size
--cuda-graphs --hostname --port --prometheus-port --shard-uds-path --master-addr --master-port
--huggingface-hub-cache --weights-cache-override --disable-custom-kernels --cuda-memory-fraction
--rope-scaling --rope-factor --json-output --otlp-endpoint --otlp-service-name --cors-allow-origin
--api-key --watermark-gamma --watermark-delta --ngrok --ngrok-authtoken --ngrok-edge
--tokenizer-config-path --disable-grammar-support --env --max-client-batch-size --lora-adapters
--usage-stats --payload-limit --enable-prefill-logprobs --graceful-termination-timeout
""".split()
# TGI's llama.cpp backend (both spellings its releases used)
TGI_LLAMA_CPP_FLAGS = """
--model-gguf --n-threads --n-threads-batch --n-gpu-layers --split-mode --defrag-threshold --numa
--disable-mmap --use-mmap --use-mlock --disable-offload-kqv --offload-kqv --disable-flash-attention
--flash-attention --type-k --type-v --max-physical-batch-total-tokens
""".split()

# flag -> (its arguments, where it lands in the built configs, the value expected there)
CONFIG_EFFECTS = {
    "--model-id": (["m"], lambda c: c.model.model_id, "m"),
    "--model-gguf": (["f.gguf"], lambda c: c.model.gguf_file, "f.gguf"),
    "--revision": (["v1"], lambda c: c.model.revision, "v1"),
    "--dtype": (["bfloat16"], lambda c: c.model.dtype, "bfloat16"),
    "--trust-remote-code": ([], lambda c: c.model.trust_remote_code, True),
    "--allow-pickle-weights": ([], lambda c: c.model.allow_pickle_weights, True),
    "--model-implementation": (
        ["transformers"],
        lambda c: c.model.implementation,
        "transformers",
    ),  # fmt: skip
    "--huggingface-hub-cache": (["/h"], lambda c: c.model.hub_cache_dir, "/h"),
    "--tokenizer-config-path": (["/t"], lambda c: c.model.tokenizer_config_path, "/t"),
    "--max-batch-prefill-tokens": (
        ["77"],
        lambda c: c.engine.scheduler.max_batch_prefill_tokens,
        77,
    ),  # fmt: skip
    "--max-physical-batch-total-tokens": (
        ["78"],
        lambda c: c.engine.scheduler.max_batch_prefill_tokens,
        78,
    ),  # fmt: skip
    "--max-batch-total-tokens": (
        ["5000"],
        lambda c: c.engine.scheduler.max_batch_total_tokens,
        5000,
    ),  # fmt: skip
    "--max-batch-size": (["3"], lambda c: c.engine.scheduler.max_batch_size, 3),
    "--num-blocks": (["9"], lambda c: c.engine.cache.num_blocks, 9),
    "--block-size": (["32"], lambda c: c.engine.cache.block_size, 32),
    "--kv-cache-memory-fraction": (["0.5"], lambda c: c.engine.cache.memory_fraction, 0.5),
    "--max-kv-cache-bytes": (["1000"], lambda c: c.engine.cache.max_kv_cache_bytes, 1000),
    "--disable-prefix-caching": ([], lambda c: c.engine.cache.enable_prefix_caching, False),
    "--disable-prefill-chunking": (
        [],
        lambda c: c.engine.scheduler.enable_chunked_prefill,
        False,
    ),  # fmt: skip
    "--num-threads": (["3"], lambda c: c.engine.num_threads, 3),
    "--n-threads": (["5"], lambda c: c.engine.num_threads, 5),
    "--num-shard": (["2"], lambda c: c.engine.parallel.num_shard, 2),
    "--sharded": (["false"], lambda c: c.args.sharded, False),
    "--master-addr": (["10.0.0.1"], lambda c: c.engine.parallel.master_addr, "10.0.0.1"),
    "--master-port": (["29999"], lambda c: c.engine.parallel.master_port, 29999),
    "--quantize": (["fp8"], lambda c: c.model.quantize, "fp8"),
    "--cuda-graphs": (["0"], lambda c: c.engine.device.cuda_graphs, ()),
    "--cuda-memory-fraction": (["0.5"], lambda c: c.engine.device.cuda_memory_fraction, 0.5),
    "--speculate": (["2"], lambda c: c.engine.scheduler.num_speculative_tokens, 2),
    "--speculation-policy": (["always"], lambda c: c.engine.scheduler.speculation_policy, "always"),
    "--disable-custom-kernels": ([], lambda c: c.engine.device.kernels, False),
    "--rope-scaling": (["dynamic"], lambda c: c.model.rope_scaling, ("dynamic", 1.0)),
    "--rope-factor": (["2"], lambda c: c.model.rope_scaling, ("linear", 2.0)),
    "--weights-cache-override": (["/w"], lambda c: c.model.weights_dir, "/w"),
    "--max-concurrent-requests": (["7"], lambda c: c.limits.max_concurrent_requests, 7),
    "--max-best-of": (["3"], lambda c: c.limits.max_best_of, 3),
    "--max-stop-sequences": (["6"], lambda c: c.limits.max_stop_sequences, 6),
    "--max-top-n-tokens": (["8"], lambda c: c.limits.max_top_n_tokens, 8),
    "--max-input-tokens": (["100"], lambda c: c.limits.max_input_tokens, 100),
    "--max-input-length": (["101"], lambda c: c.limits.max_input_tokens, 101),
    "--max-total-tokens": (["200"], lambda c: c.limits.max_total_tokens, 200),
    "--max-client-batch-size": (["9"], lambda c: c.limits.max_client_batch_size, 9),
    "--payload-limit": (["1234"], lambda c: c.limits.payload_limit, 1234),
    "--validation-workers": (["5"], lambda c: c.limits.validation_workers, 5),
    "--hostname": (["127.0.0.1"], lambda c: c.server.hostname, "127.0.0.1"),
    "--port": (["3123"], lambda c: c.server.port, 3123),
    "--prometheus-port": (["9123"], lambda c: c.server.prometheus_port, 9123),
    "--api-key": (["k"], lambda c: c.server.api_key, "k"),
    "--cors-allow-origin": (["http://a"], lambda c: c.server.cors_allow_origin, ("http://a",)),
    "--json-output": ([], lambda c: c.server.json_output, True),
    "--graceful-termination-timeout": (
        ["5"],
        lambda c: c.server.graceful_termination_timeout_s,
        5.0,
    ),  # fmt: skip
    "--request-header-timeout": (["3"], lambda c: c.server.request_header_timeout_s, 3.0),
    "--request-body-timeout": (["4"], lambda c: c.server.request_body_timeout_s, 4.0),
    "--max-connections": (["12"], lambda c: c.server.max_connections, 12),
    "--enable-prefill-logprobs": ([], lambda c: c.server.enable_prefill_logprobs, True),
    "--disable-grammar-support": ([], lambda c: c.engine.grammar, None),
    "--disable-playground": ([], lambda c: c.server.playground, False),
    "--watermark-gamma": (["0.25"], lambda c: c.engine.watermark.gamma, 0.25),
    "--watermark-delta": (["3"], lambda c: c.engine.watermark.delta, 3.0),
    "--grammar-compile-timeout": (["3"], lambda c: c.engine.grammar.compile_timeout_s, 3.0),
    "--max-grammar-bytes": (["99"], lambda c: c.engine.grammar.max_grammar_bytes, 99),
    "--max-grammar-size": (["98"], lambda c: c.engine.grammar.max_grammar_size, 98),
    "--max-grammar-lexer-states": (["97"], lambda c: c.engine.grammar.max_lexer_states, 97),
    "--grammar-compile-fuel": (["96"], lambda c: c.engine.grammar.initial_lexer_fuel, 96),
    "--grammar-mask-fuel": (["95"], lambda c: c.engine.grammar.step_lexer_fuel, 95),
    "--grammar-compile-threads": (["2"], lambda c: c.engine.grammar.compile_threads, 2),
    "--grammar-mask-threads": (["3"], lambda c: c.engine.grammar.mask_threads, 3),
    "--grammar-cache-size": (["4"], lambda c: c.engine.grammar.cache_size, 4),
    "--grammar-cache-bytes": (["1000"], lambda c: c.engine.grammar.cache_bytes, 1000),
    "--quantize-activations": (["fp32"], lambda c: c.model.quantize_activations, "fp32"),
    "--max-image-fetch-size": (["1000"], lambda c: c.images.max_fetch_bytes, 1000),
    "--image-fetch-timeout": (["3"], lambda c: c.images.fetch_timeout_s, 3.0),
    "--max-image-pixels": (["1000"], lambda c: c.images.max_pixels, 1000),
    "--allow-private-image-urls": ([], lambda c: c.images.allow_private_urls, True),
}

# flags whose effect is not in the configs: the test that drives them (file::function; the file
# must pass the flag)
BEHAVIOUR_TESTS = {
    "--env": "tests/cli/test_generate_and_serve_cli.py::test_env_flag_logs_the_runtime_environment",
    "--otlp-endpoint": "tests/e2e/test_launcher_flags.py::test_otlp_spans_reach_the_collector",
    "--otlp-service-name": "tests/e2e/test_launcher_flags.py::test_otlp_spans_reach_the_collector",
    "--max-waiting-tokens": "tests/e2e/test_launcher_flags.py::test_waiting_flags_get_tgi_warning",
    "--waiting-served-ratio": "tests/cli/test_flag_walk.py::test_waiting_flags_warn_as_tgi_3",
    "--kv-cache-dtype": (
        "tests/e2e/test_kv_cache_dtype.py::test_a_narrow_cache_is_served_and_reported"
    ),
    "--lora-adapters": "tests/e2e/test_lora_serving.py::test_adapters_in_one_batch_match_peft",
}


class Built:
    """The configs `pytgi serve ARGV` would start with (KV capacity as warm-up might find it)."""

    def __init__(self, argv: list[str]):
        parser = _serve_parser()
        self.args = parser.parse_args(argv)
        self.model = configs.model_config(self.args)
        self.engine = configs.engine_config(self.args, self.model)
        cache = CacheInfo(
            num_blocks=64, block_size=16, max_total_tokens=1024, max_input_tokens=1023,
            max_batch_total_tokens=8192, max_position_embeddings=1024, dtype="float32",
            device="cpu",
        )  # fmt: skip
        self.limits = configs.limits_config(self.args, cache, 4096)
        self.server = configs.server_config(self.args, self.limits, "m", None)
        self.images = configs.image_config(self.args)


def _serve_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"]


def accepted_flags() -> list[str]:
    """Every long option `pytgi serve` accepts (help and version aside)."""
    names = []
    for action in _serve_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and longs[0] not in ("--help", "--version"):
            names.append(longs[0])
    return names


def documented_noops() -> set[str]:
    """The flags listed in the compatibility doc's "No-op flags" section."""
    text = COMPATIBILITY_DOC.read_text()
    section = text.split("## No-op flags", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(--[a-z0-9-]+)`", section))


REFUSED = {flag.name: flag for flag in REFUSED_FLAGS}


def test_every_accepted_flag_is_wired_refused_or_a_documented_noop():
    placed = set(CONFIG_EFFECTS) | set(BEHAVIOUR_TESTS) | set(REFUSED)
    unplaced = [f for f in accepted_flags() if f not in placed | documented_noops()]
    assert not unplaced, f"accepted but neither wired, refused nor a documented no-op: {unplaced}"


def test_every_tgi_flag_is_accepted():
    missing = set(TGI_LAUNCHER_FLAGS + TGI_LLAMA_CPP_FLAGS) - set(accepted_flags())
    assert not missing, (
        f"TGI flags pytgi does not know (argparse would refuse them bare): {missing}"
    )


def test_documented_noops_are_accepted_flags_and_not_wired():
    noops = documented_noops()
    assert noops, "the compatibility doc lists no no-op flag"
    assert noops <= set(accepted_flags())
    assert not noops & (set(CONFIG_EFFECTS) | set(REFUSED))


@pytest.mark.parametrize("flag", sorted(CONFIG_EFFECTS))
def test_flag_changes_the_configs(flag):
    argv, where, expected = CONFIG_EFFECTS[flag]
    if flag == "--quantize":
        argv = [*argv, "--dtype", "float32"]
    assert where(Built([flag, *argv])) == expected
    assert where(Built([])) != expected  # the default differs: the flag is what changed it


@pytest.mark.parametrize("flag", sorted(BEHAVIOUR_TESTS))
def test_behaviour_test_exists_and_passes_the_flag(flag):
    path, _, name = BEHAVIOUR_TESTS[flag].partition("::")
    text = (ROOT / path).read_text()
    assert f"def {name}(" in text
    assert f'"{flag}"' in text or flag == "--waiting-served-ratio"


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_refused_flag_ends_start_up_naming_it(flag):
    argv = [flag] if REFUSED[flag].switch else [flag, "1"]
    with pytest.raises(ConfigError, match=f"^{flag} is not supported by pytgi: "):
        Built(argv)


def test_refusal_is_one_line_through_the_launcher(capsys):
    assert launcher_main(["--n-gpu-layers", "10", "--port", "0"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].endswith(
        "--n-gpu-layers is not supported by pytgi: pytgi runs the whole model on one device per "
        "shard"
    )


def test_prometheus_port_defaults_to_tgi_9000():
    assert Built([]).server.prometheus_port == 9000
    assert Built(["--prometheus-port", "0"]).server.prometheus_port == 0


def test_waiting_flags_warn_as_tgi_3(caplog):
    from pytgi.cli.startup_notes import WAITING_WARNING, warn_waiting_flags

    warn_waiting_flags(Built([]).args)
    assert WAITING_WARNING not in caplog.text
    for argv in (["--waiting-served-ratio", "1.2"], ["--max-waiting-tokens", "3"]):
        caplog.clear()
        warn_waiting_flags(Built(argv).args)
        assert WAITING_WARNING in caplog.text


def test_llama_cpp_alias_that_disagrees_is_refused():
    with pytest.raises(ConfigError, match="--n-threads 2 and --num-threads 3 disagree"):
        Built(["--n-threads", "2", "--num-threads", "3"])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORT": "abc"}, "environment variable PORT='abc': expected an integer"),
        ({"DTYPE": "x"}, "environment variable DTYPE='x': expected one of float32"),
        ({"SHARDED": "maybe"}, "environment variable SHARDED='maybe': expected true or false"),
    ],
)
def test_bad_env_twin_is_one_line_even_for_version(env, message):
    import os

    result = subprocess.run(
        [sys.executable, "-m", "pytgi", "-V"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pytgi: {message}")


def test_env_is_not_a_twin(monkeypatch):
    monkeypatch.setenv("ENV", "production")  # common in deployments; TGI's --env has no twin
    assert Built([]).args.env is False
