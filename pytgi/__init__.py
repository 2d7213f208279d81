"""pytgi: a text-generation-inference compatible LLM server in Python."""

from pytgi.version import __version__

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # lazy, so `import pytgi` stays cheap for the API process and the CLI
    if name == "LLM":
        from pytgi.runtime.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pytgi.messages.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
