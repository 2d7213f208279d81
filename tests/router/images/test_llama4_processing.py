"""Llama 4's image processing (router/images/llama4.py): the canvases, the best fit and the
distortion-free size against the examples transformers documents for its processor (as its
code computes them), the tiles
and the global tile of a processed image, and the prompt layout from Llama4Processor."""

from __future__ import annotations

import numpy as np
from PIL import Image

from pytgi.router.images.llama4 import Llama4ImageProcessor, _fit_without_distortion, image_prompt


def test_canvases_and_best_fit_match_the_documented_examples():
    processor = Llama4ImageProcessor(size=224, max_patches=4)
    assert processor.canvases() == [
        (224, 896), (448, 448), (224, 224), (896, 224), (224, 672), (672, 224), (224, 448),
        (448, 224),
    ]  # fmt: skip
    assert processor.best_canvas(200, 300) == (224, 448)  # smallest upscale, smallest area
    assert processor.best_canvas(2000, 500) == (896, 224)  # no upscale: the mildest downscale
    # the processor's code floors the scaled side (its docstring's examples round: 134, 338)
    assert _fit_without_distortion(200, 300, 450, 200) == (133, 200)
    assert _fit_without_distortion(800, 600, 450, 1300) == (450, 337)


def test_tiles_padding_and_global_tile():
    processor = Llama4ImageProcessor(size=56, max_patches=4)
    white = Image.fromarray(np.full((40, 100, 3), 255, dtype=np.uint8))  # height 40, width 100
    tiles, grid = processor(white)
    assert grid == (1, 2)  # a 56 x 112 canvas
    assert tiles.shape == (3, 3, 56, 56) and tiles.dtype == np.float32
    # no upscaling past its own width (above one tile's size): kept at 40 x 100, then padded
    # with zeros to the right and below, -1 once normalised
    left, right = tiles[0], tiles[1]
    assert np.all(left[:, :40] == 1.0) and np.all(left[:, 40:] == -1.0)
    assert np.all(right[:, :40, :44] == 1.0) and np.all(right[:, :, 44:] == -1.0)
    assert np.all(right[:, 40:] == -1.0)
    assert np.all(tiles[2] == 1.0)  # the global tile: the whole image at 56 x 56
    one_tile, grid = processor(Image.fromarray(np.zeros((30, 30, 3), dtype=np.uint8)))
    assert grid == (1, 1) and one_tile.shape == (1, 3, 56, 56)  # no global tile for one tile


def test_prompt_layout_is_llama4_processors():
    assert image_prompt(1, 2, 2) == (
        "<|image_start|><|patch|><|patch|><|tile_x_separator|><|patch|><|patch|>"
        "<|tile_y_separator|><|image|><|patch|><|patch|><|image_end|>"
    )
    assert image_prompt(1, 1, 1) == "<|image_start|><|image|><|patch|><|image_end|>"
