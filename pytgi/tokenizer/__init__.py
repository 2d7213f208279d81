"""Text ↔ ids: the HF fast tokenizer, sandboxed chat templates, incremental detokenization."""
