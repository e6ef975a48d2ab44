"""Image metrics: PSNR per image, SSIM against scikit-image, LPIPS only with local weights."""

import pytest
import torch
from safetensors.torch import save_file
from skimage.metrics import structural_similarity

from _lvsm_helpers import random_lpips_weights

from hrope.nvs.metrics import LPIPS, MetricError, image_metrics, psnr, ssim


def test_psnr_per_image():
    target = torch.full((2, 3, 16, 16), 0.5)
    pred = target.clone()
    pred[0] += 0.1  # MSE 0.01 -> 20 dB
    pred[1] += 0.01  # MSE 1e-4 -> 40 dB
    torch.testing.assert_close(psnr(pred, target), torch.tensor([20.0, 40.0]))
    assert psnr(target, target).isinf().all()


def test_ssim_matches_scikit_image():
    torch.manual_seed(0)
    target = torch.rand(2, 3, 32, 32)
    pred = (target + 0.1 * torch.randn_like(target)).clamp(0, 1)
    ours = ssim(pred, target)
    for i in range(2):
        theirs = structural_similarity(
            pred[i].numpy(),
            target[i].numpy(),
            gaussian_weights=True,
            win_size=11,
            data_range=1.0,
            channel_axis=0,
            use_sample_covariance=False,
        )
        assert float(ours[i]) == pytest.approx(theirs, abs=1e-4)
    torch.testing.assert_close(ssim(target, target), torch.ones(2))
    with pytest.raises(MetricError, match="at least 11x11"):
        ssim(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8))
    with pytest.raises(MetricError, match=r"\(B, 3, H, W\)"):
        psnr(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 9))


def test_lpips_needs_local_weights_and_measures_differences(tmp_path):
    with pytest.raises(MetricError, match="not found"):
        LPIPS(tmp_path / "missing.safetensors")
    path = tmp_path / "lpips_alex.safetensors"
    random_lpips_weights(path)  # random backbone: plumbing only, values are not meaningful
    lpips = LPIPS(path)
    a, b = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    metrics = image_metrics(a, b, lpips)
    assert metrics["lpips"].shape == (2,) and (metrics["lpips"] > 0).all()
    torch.testing.assert_close(lpips(a, a), torch.zeros(2))
    assert "lpips" not in image_metrics(a, b)
    save_file({"features.0.weight": torch.zeros(64, 3, 11, 11)}, str(tmp_path / "partial.safetensors"))
    with pytest.raises(MetricError, match="lack"):
        LPIPS(tmp_path / "partial.safetensors")
