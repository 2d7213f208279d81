"""Llama 4's image processing. transformers has only a torchvision-based ("fast") processor for
Llama 4, which does not load beside this CPU torch, so this is the same algorithm in plain torch,
read from `preprocessor_config.json`:

1. the canvases: every (rows, cols) grid of at most `max_patches` tiles of `size` pixels;
2. the best canvas for the image: the smallest upscale >= 1 that fits (the largest with
   `resize_to_max_canvas`), else the mildest downscale; ties go to the smallest area;
3. the image resized without distortion to fit it (bilinear with antialias on the uint8 image,
   as torchvision resizes tensors; upscaling capped at `size` unless `resize_to_max_canvas`),
   padded with zeros at the bottom and right, rescaled and normalised in bfloat16 (the
   original implementation's precision), cut into rows x cols tiles;
4. with more than one tile, a global tile: the whole image resized to `size` (distorted).

The prompt layout is Llama4Processor's own (`_prompt_split_image`): <|image_start|>, the tiles'
runs of <|patch|> tokens separated by <|tile_x_separator|> and closed per row by
<|tile_y_separator|> (only when there are several tiles), then <|image|> and the global tile's
run, and <|image_end|>. Each run has (size / patch_size)^2 * pixel_shuffle_ratio^2 tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytgi.errors import ModelLoadError


@dataclass(frozen=True)
class Llama4ImageProcessor:
    size: int
    max_patches: int = 16
    resize_to_max_canvas: bool = False
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> Llama4ImageProcessor:
        path = Path(model_dir) / "preprocessor_config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        size = config.get("size", {"height": 336, "width": 336})
        if size.get("height") != size.get("width"):
            raise ModelLoadError("Llama 4's image processor needs a square `size`")
        if config.get("resample", 2) != 2:
            raise ModelLoadError("Llama 4's image processor: only bilinear resampling (2)")
        if config.get("do_resize", True) is False or config.get("do_normalize", True) is False:
            raise ModelLoadError("Llama 4's image processor: do_resize / do_normalize must be on")
        return cls(
            size=int(size["height"]),
            max_patches=int(config.get("max_patches", 16)),
            resize_to_max_canvas=bool(config.get("resize_to_max_canvas", False)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
            image_mean=tuple(config.get("image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(config.get("image_std", (0.5, 0.5, 0.5))),
        )

    def canvases(self) -> list[tuple[int, int]]:
        """Every (height, width) canvas of at most max_patches tiles, in the processor's order."""
        by_ratio: dict[float, list[tuple[int, int]]] = {}
        for count in range(self.max_patches, 0, -1):
            for rows in sorted(d for d in range(1, count + 1) if count % d == 0):
                by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
        return [(r * self.size, c * self.size) for grid in by_ratio.values() for r, c in grid]

    def best_canvas(self, height: int, width: int) -> tuple[int, int]:
        import torch

        canvases = torch.tensor(self.canvases())  # [N, 2]
        scale_w = canvases[:, 1] / width
        scale_h = canvases[:, 0] / height
        scales = torch.where(scale_h > scale_w, scale_w, scale_h)  # [N]
        up = scales[scales >= 1]
        if len(up) > 0:
            chosen = up.max() if self.resize_to_max_canvas else up.min()
        else:
            chosen = scales[scales < 1].max()
        options = canvases[scales == chosen]
        best = options[torch.argmin(options[:, 0] * options[:, 1])]
        return int(best[0]), int(best[1])

    def __call__(self, image) -> tuple[np.ndarray, tuple[int, int]]:
        """A PIL image -> (tiles [n, 3, size, size] float32, (rows, cols)); n = rows * cols,
        plus the global tile when that is more than one."""
        import torch

        pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)  # uint8
        height, width = pixels.shape[-2:]
        canvas_h, canvas_w = self.best_canvas(height, width)
        fit_h, fit_w = canvas_h, canvas_w
        if not self.resize_to_max_canvas:  # no upscaling past one tile's size
            fit_h = min(max(height, self.size), canvas_h)
            fit_w = min(max(width, self.size), canvas_w)
        new_h, new_w = _fit_without_distortion(height, width, fit_h, fit_w)
        resized = _resize(pixels, max(new_h, 1), max(new_w, 1))
        padded = torch.nn.functional.pad(
            resized, (0, canvas_w - resized.shape[-1], 0, canvas_h - resized.shape[-2])
        )
        rows, cols = canvas_h // self.size, canvas_w // self.size
        tiles = self._normalize(padded)  # [3, H, W]
        tiles = tiles.view(3, rows, self.size, cols, self.size).permute(1, 3, 0, 2, 4)
        tiles = tiles.reshape(rows * cols, 3, self.size, self.size)
        if rows * cols > 1:
            global_tile = self._normalize(_resize(pixels, self.size, self.size))
            tiles = torch.cat([tiles, global_tile.unsqueeze(0)])
        return tiles.float().numpy(), (rows, cols)

    def _normalize(self, pixels):
        """uint8 [3, H, W] -> ((x * rescale) - mean) / std, computed in bfloat16."""
        import torch

        x = pixels.to(torch.bfloat16) * self.rescale_factor
        mean = torch.tensor(self.image_mean, dtype=torch.bfloat16).view(-1, 1, 1)
        std = torch.tensor(self.image_std, dtype=torch.bfloat16).view(-1, 1, 1)
        return (x - mean) / std


def _fit_without_distortion(height: int, width: int, target_h: int, target_w: int):
    """The largest (height, width) within the target keeping the image's aspect ratio."""
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(int(height * scale_w), target_h), target_w
    return target_h, min(int(width * scale_h), target_w)


def _resize(pixels, height: int, width: int):
    """uint8 [3, H, W] -> uint8 [3, height, width], bilinear with antialias (torchvision's tensor
    resize runs this same torch kernel on uint8 images)."""
    import torch

    out = torch.nn.functional.interpolate(
        pixels.unsqueeze(0), size=(height, width), mode="bilinear", antialias=True,
        align_corners=False,
    )  # fmt: skip
    return out.squeeze(0)


def image_prompt(rows: int, cols: int, run_length: int) -> str:
    """Llama4Processor's text for one image of rows x cols tiles."""
    from transformers.models.llama4.processing_llama4 import Llama4Processor

    layout = Llama4Processor.__new__(Llama4Processor)  # its prompt builder, no tokenizer
    return layout._prompt_split_image((rows, cols), run_length)
