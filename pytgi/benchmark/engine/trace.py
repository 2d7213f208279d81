"""The raw record of one benchmark run, the same shape for pytgi and for transformers.

Times are seconds relative to the run's start (when every request had been submitted). A
"decode step" is one forward that produces one token for every running sequence and runs no
prompt tokens; prefill time is the time of the forwards that ran prompt tokens (pytgi: steps
with any prompt tokens, which may also carry decodes; transformers: the first forward of
`generate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestTrace:
    prompt_len: int
    output_len: int  # tokens the request asked for: the useful ones
    token_times_s: list[float] = field(default_factory=list)  # one per useful generated token

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0]

    def inter_token_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass
class RunTrace:
    system: str  # "pytgi", "hf_sequential" or "hf_static"
    requests: list[RequestTrace]
    wall_s: float = 0.0
    num_prefill_tokens: int = 0
    prefill_time_s: float = 0.0
    num_decode_tokens: int = 0  # tokens produced by decode steps (useful tokens only)
    decode_time_s: float = 0.0
    decode_step_s: list[float] = field(default_factory=list)  # duration of each decode step
    num_preemptions: int = 0
    num_replayed: int = 0  # requests not run but timed as copies of identical ones (hf_runner)
    others: float | None = None  # CPU share used by other processes meanwhile (see contention.py)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(r.token_times_s) for r in self.requests)

    def check_complete(self) -> None:
        """Every request produced exactly the tokens it asked for (EOS is ignored)."""
        for index, req in enumerate(self.requests):
            if len(req.token_times_s) != req.output_len:
                raise RuntimeError(
                    f"{self.system}: request {index} produced {len(req.token_times_s)} tokens, "
                    f"expected {req.output_len}"
                )
