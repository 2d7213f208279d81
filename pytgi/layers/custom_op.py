"""`CustomOp`: an op with a plain-torch reference and per-platform implementations, chosen once.

Subclasses write `forward_native` (the reference everywhere, what tests compare against) and may
add `forward_<platform>` (e.g. `forward_cpu`, which uses `self.kernels`). The constructor picks
`forward_<platform>` when the build context has kernels for this model's dtype, else
`forward_native`; `forward` then calls the choice with no availability check per call.
"""

from __future__ import annotations

from torch import nn

from pytgi.layers.build_context import current_build_context


class CustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        context = current_build_context()
        platform_forward = getattr(self, f"forward_{context.platform_name}", None)
        self.kernels = context.kernels if platform_forward is not None else None
        self._forward = platform_forward if self.kernels is not None else self.forward_native

    def native_on(self, *platforms: str) -> None:
        """Use the reference on these platforms: for an option their kernel does not implement.
        Called by a subclass's constructor once its options are known."""
        if current_build_context().platform_name in platforms:
            self.kernels, self._forward = None, self.forward_native

    def forward(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError
