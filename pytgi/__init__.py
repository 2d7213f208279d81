"""pytgi: a text-generation-inference compatible LLM server in Python."""

__version__ = "0.1.0"
