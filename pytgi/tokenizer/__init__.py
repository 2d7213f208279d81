"""pytgi.tokenizer"""
