"""GGUF checkpoints (llama.cpp's format): the file, its config and tokenizer, its tensors.

    from pytgi.models.gguf.files import find_gguf_file      # torch-free
    from pytgi.models.gguf.checkpoint import GGUFCheckpoint

    path = find_gguf_file(model_config, gguf_file)   # None: not a GGUF model
    checkpoint = GGUFCheckpoint(path)                 # metadata parsed once; refuses non-Llama
    checkpoint.hf_config                              # transformers LlamaConfig
    checkpoint.write_hf_files(out_dir)                # config/generation/tokenizer files
    for name, weight in checkpoint.iter_weights():    # HF names; Tensor or QuantizedWeight
        ...

Parsing is the maintained `gguf` package's (`GGUFReader`, memory-mapped); config and tokenizer
come through transformers' GGUF tables and converter. This package sits under `models/` because
it produces `QuantizedWeight`s (from `layers/`) for the model loader; the API process gets the
tokenizer from the files `write_hf_files` writes, so `tokenizer/` stays a torch-free leaf.
Building those files imports torch (transformers' GGUF converter does); finding the file does not,
which is why this package re-exports nothing.
"""
