"""How close a reconstruction is to the private images: MSE, PSNR, SSIM, and a picture of both.

Images are arrays or tensors of shape [N, C, H, W]. The metrics are scikit-image's
(``peak_signal_noise_ratio``, ``structural_similarity``) with ``data_range`` always given
explicitly — the width of the data's range, 1.0 for this project's images in [0, 1] — since
scikit-image would otherwise guess it from the dtype (−1..1 for floats: PSNR off by 6 dB).

*Order.* A batch's reconstructions come back in arbitrary order: the gradient of a batch is
a sum over its examples, so any permutation of the dummy images matches equally well. Before
scoring, each reconstruction is paired with one ground-truth image by the assignment that
minimises the total MSE (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``), as
breaching and the papers' evaluations do; :func:`match_reconstructions` returns that order.

*Identical images.* MSE 0, SSIM 1 and PSNR +inf (10·log10(range²/0)); inf is kept in the
per-image values (and written as ``null`` in JSON files).
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from audit.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    from scipy import optimize
    from skimage import metrics as skimage_metrics
else:  # imported when first used (audit.core.lazy_modules): skimage loads scipy.stats, `list` needs no scipy.optimize
    torch = lazy_module("torch")
    optimize = lazy_module("scipy.optimize")
    skimage_metrics = lazy_module("skimage.metrics")

ImageBatch: TypeAlias = "np.ndarray | torch.Tensor"


def _array(images: ImageBatch) -> np.ndarray:
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 4:
        raise ValueError(f"images must have shape [N, C, H, W], got {images.shape}")
    return images


def _pair(truth: ImageBatch, reconstruction: ImageBatch) -> tuple[np.ndarray, np.ndarray]:
    truth, reconstruction = _array(truth), _array(reconstruction)
    if truth.shape != reconstruction.shape:
        raise ValueError(f"truth {truth.shape} and reconstruction {reconstruction.shape} differ in shape")
    return truth, reconstruction


def mse_per_image(truth: ImageBatch, reconstruction: ImageBatch) -> np.ndarray:
    """Mean squared error of each image pair, float64 [N]."""
    truth, reconstruction = _pair(truth, reconstruction)
    return ((truth - reconstruction) ** 2).mean(axis=(1, 2, 3))


def psnr_per_image(truth: ImageBatch, reconstruction: ImageBatch, data_range: float = 1.0) -> np.ndarray:
    """Peak signal-to-noise ratio 10·log10(range²/MSE) in dB of each pair; +inf for identical images."""
    truth, reconstruction = _pair(truth, reconstruction)
    with np.errstate(divide="ignore"):  # identical images: MSE 0 → +inf, by definition
        return np.array([skimage_metrics.peak_signal_noise_ratio(t, r, data_range=data_range)
                         for t, r in zip(truth, reconstruction)])


def _window(height: int, width: int) -> int:
    """SSIM's uniform 7×7 window, shrunk (odd, ≥ 3) for images smaller than 7 pixels."""
    side = min(7, height, width)
    return side if side % 2 == 1 else side - 1


def ssim_per_image(truth: ImageBatch, reconstruction: ImageBatch, data_range: float = 1.0) -> np.ndarray:
    """Structural similarity (Wang et al. 2004) of each pair, scikit-image's defaults (7×7 uniform
    window, K1 = 0.01, K2 = 0.03), channels averaged for colour images."""
    truth, reconstruction = _pair(truth, reconstruction)
    _, channels, height, width = truth.shape
    if min(height, width) < 3:
        raise ValueError(f"SSIM needs images of at least 3×3 pixels, got {height}×{width}")
    window = _window(height, width)
    scores = []
    for t, r in zip(truth, reconstruction):
        if channels == 1:
            scores.append(skimage_metrics.structural_similarity(t[0], r[0], data_range=data_range, win_size=window))
        else:
            scores.append(skimage_metrics.structural_similarity(t, r, data_range=data_range, win_size=window, channel_axis=0))
    return np.array(scores, dtype=np.float64)


def match_reconstructions(truth: ImageBatch, reconstruction: ImageBatch) -> np.ndarray:
    """The order that pairs reconstructions with ground truth: ``reconstruction[order[i]]`` is
    matched to ``truth[i]``, minimising the total MSE over one-to-one pairings (Hungarian)."""
    truth, reconstruction = _pair(truth, reconstruction)
    flat_truth = truth.reshape(len(truth), -1)
    flat_reconstruction = reconstruction.reshape(len(reconstruction), -1)
    cost = ((flat_truth[:, None, :] - flat_reconstruction[None, :, :]) ** 2).mean(axis=2)
    rows, columns = optimize.linear_sum_assignment(cost)
    order = np.empty(len(truth), dtype=np.int64)
    order[rows] = columns
    return order


def image_quality(truth: ImageBatch, reconstruction: ImageBatch, data_range: float = 1.0,
                  match: bool = True) -> dict:
    """Per-image and mean MSE, PSNR, SSIM after best-matching the order (``match``).

    Returns ``{"order": [...], "mse": [...], "psnr": [...], "ssim": [...], "mean_mse": ...,
    "mean_psnr": ..., "mean_ssim": ...}``; per-image lists follow the order of ``truth``.
    The mean PSNR is the mean of the per-image dB values (+inf if any pair is identical).
    """
    truth, reconstruction = _pair(truth, reconstruction)
    order = match_reconstructions(truth, reconstruction) if match else np.arange(len(truth))
    matched = reconstruction[order]
    mse = mse_per_image(truth, matched)
    psnr = psnr_per_image(truth, matched, data_range)
    ssim = ssim_per_image(truth, matched, data_range)
    return {"order": order.tolist(), "mse": mse.tolist(), "psnr": psnr.tolist(), "ssim": ssim.tolist(),
            "mean_mse": float(mse.mean()), "mean_psnr": float(psnr.mean()), "mean_ssim": float(ssim.mean())}


# --------------------------------------------------------------------------- pictures


def image_grid_png(truth: ImageBatch, reconstruction: ImageBatch, data_range: tuple[float, float] = (0.0, 1.0),
                   scale: int | None = None, gap: int = 2) -> bytes:
    """A PNG: the ground truth in the top row, the (matched) reconstructions below, column by column.

    Pixel values are mapped from ``data_range`` to 0..255 (clipped); small images are enlarged
    by an integer factor (nearest neighbour, default: to about 96 pixels); white gaps separate
    the tiles. Written with Pillow without metadata, so the same images give the same bytes.
    """
    from PIL import Image

    truth, reconstruction = _pair(truth, reconstruction)
    count, channels, height, width = truth.shape
    if channels not in (1, 3):
        raise ValueError(f"image grids need 1 or 3 channels, got {channels}")
    scale = scale or max(1, 96 // max(height, width))
    low, high = data_range

    def tile(image: np.ndarray) -> np.ndarray:
        pixels = np.clip((image - low) / (high - low), 0.0, 1.0)
        pixels = np.round(pixels * 255.0).astype(np.uint8).transpose(1, 2, 0)  # H, W, C
        return pixels.repeat(scale, axis=0).repeat(scale, axis=1)

    tile_h, tile_w = height * scale, width * scale
    canvas = np.full((2 * tile_h + 3 * gap, count * tile_w + (count + 1) * gap, channels), 255, dtype=np.uint8)
    for row, images in enumerate((truth, reconstruction)):
        for column, image in enumerate(images):
            top, left = gap + row * (tile_h + gap), gap + column * (tile_w + gap)
            canvas[top:top + tile_h, left:left + tile_w] = tile(image)
    picture = Image.fromarray(canvas[:, :, 0] if channels == 1 else canvas)  # uint8: "L" or "RGB"
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def png_base64(png: bytes) -> str:
    """The PNG as base64 text, e.g. for ``<img src="data:image/png;base64,...">`` in an HTML report."""
    return base64.b64encode(png).decode("ascii")
