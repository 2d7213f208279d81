"""`pytgi generate "prompt"`: stream one completion to the terminal (the demo model by default)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from pytgi.cli.flags import (
    MODEL_FLAGS,
    QUANTIZE_FLAG,
    Flag,
    add_flags,
)

GENERATE_FLAGS = [
    Flag("--max-new-tokens", "Tokens to generate", int, 64),
    Flag("--do-sample", "Sample instead of greedy decoding", switch=True),
    Flag("--temperature", "Sampling temperature (implies sampling when != 1)", float),
    Flag("--top-k", "Keep the k most likely tokens", int),
    Flag("--top-p", "Nucleus sampling threshold, in (0, 1)", float),
    Flag("--typical-p", "Typical sampling threshold, in (0, 1)", float),
    Flag("--repetition-penalty", "Penalty for repeated tokens (> 0)", float),
    Flag("--frequency-penalty", "Penalty proportional to token frequency, in [-2, 2]", float),
    Flag("--watermark", "Watermark the output (green-list bias)", switch=True),
    Flag("--seed", "Sampling seed", int),
    Flag("--ignore-eos", "Do not stop at EOS", switch=True),
    Flag("--num-threads", "torch intra-op threads", int),
    QUANTIZE_FLAG,
]


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="The prompt text")
    add_flags(parser, MODEL_FLAGS + GENERATE_FLAGS)


def sampling_params(args: argparse.Namespace):
    from pytgi.errors import ValidationError
    from pytgi.messages.sampling_params import SamplingParams

    temperature = 1.0 if args.temperature is None else args.temperature
    if temperature <= 0:
        raise ValidationError("`temperature` must be strictly positive")
    top_p = 1.0 if args.top_p is None else args.top_p
    typical_p = 1.0 if args.typical_p is None else args.typical_p
    top_k = args.top_k or 0
    return SamplingParams(
        do_sample=args.do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        typical_p=typical_p,
        repetition_penalty=args.repetition_penalty or 1.0,
        frequency_penalty=args.frequency_penalty or 0.0,
        watermark=args.watermark,
        seed=args.seed,
    )


def run_generate(args: argparse.Namespace) -> int:
    from pytgi.cli.configs import check_quantize, model_config
    from pytgi.cli.preflight import check_model_config, check_model_dir
    from pytgi.errors import PytgiError
    from pytgi.models.resolve import resolve_model
    from pytgi.runtime.llm import LLM
    from pytgi.tokenizer.detokenizer import IncrementalDetokenizer

    try:
        params = sampling_params(args)
        model = model_config(args)
        check_quantize(model.quantize, model.dtype, activations=model.quantize_activations)
        checks = {
            "implementation": model.implementation,
            "trust_remote_code": model.trust_remote_code,
        }
        model_dir = resolve_model(model, check_config=partial(check_model_config, **checks))
        plan = check_model_dir(model_dir, allow_pickle_weights=model.allow_pickle_weights,
                               quantize=model.quantize, dtype=model.dtype,
                               **checks)  # fmt: skip
        print(f"[model: {plan.description}]", file=sys.stderr)
        llm = LLM(str(model_dir), dtype=model.dtype, revision=model.revision,
                  num_threads=args.num_threads, implementation=model.implementation,
                  trust_remote_code=model.trust_remote_code,
                  allow_pickle_weights=model.allow_pickle_weights,
                  quantize=model.quantize)  # fmt: skip
    except PytgiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    prompt_ids = llm.tokenizer.encode(args.prompt).ids
    detok = IncrementalDetokenizer(llm.tokenizer, prompt_ids, skip_special_tokens=True)
    sys.stdout.write(args.prompt)
    reason = None
    for delta in llm.stream(prompt_ids, params, max_new_tokens=args.max_new_tokens,
                            ignore_eos=args.ignore_eos):  # fmt: skip
        for token in delta.new_tokens:
            sys.stdout.write(detok.add(token.token_id))
            sys.stdout.flush()
        reason = delta.finish_reason or reason
    sys.stdout.write(detok.flush() + "\n")
    print(f"[finish_reason: {reason.value if reason else 'unknown'}]", file=sys.stderr)
    llm.close()
    return 0
