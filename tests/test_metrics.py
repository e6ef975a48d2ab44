"""Image metrics: PSNR per image, SSIM against scikit-image, LPIPS only with local weights, ST-LPIPS
against the stlpips-pytorch package's own module."""

import contextlib
import importlib
import io
import sys
import types

import pytest
import skimage
import torch
from safetensors.torch import save_file
from skimage.metrics import structural_similarity

from _lvsm_helpers import random_lpips_weights

from hrope.nvs.evaluation.evaluate import available_st_lpips, markdown_table
from hrope.nvs.evaluation.metrics import LPIPS, STLPIPS, MetricError, image_metrics, psnr, ssim, st_lpips_weights


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


def _photo(size: int = 64) -> torch.Tensor:
    """A natural image ``(1, 3, size, size)`` in [0, 1]: the astronaut photo, downsampled."""
    image = torch.from_numpy(skimage.data.astronaut()).permute(2, 0, 1)[None].float() / 255
    return torch.nn.functional.interpolate(image, size=(size, size), mode="area")


@pytest.fixture
def package_st_lpips():
    """The stlpips-pytorch package's own ST-LPIPS (alex) module. The package imports torchvision,
    IPython and torchsummary at module level for variants ST-LPIPS (alex) does not use: empty
    stand-ins are in sys.modules only while it is imported, and every module the import added
    (the stand-ins and the package's modules) is removed afterwards."""
    before = set(sys.modules)
    stand_ins = {
        name: types.ModuleType(name) for name in ("torchvision", "torchvision.models", "IPython", "torchsummary")
    }
    stand_ins["torchvision"].models = stand_ins["torchvision.models"]
    stand_ins["IPython"].embed = None
    stand_ins["torchsummary"].summary = None
    with pytest.MonkeyPatch.context() as patch:
        for name, module in stand_ins.items():
            patch.setitem(sys.modules, name, module)
        with contextlib.redirect_stdout(io.StringIO()):
            stlpips = importlib.import_module("stlpips_pytorch.stlpips")
            module = stlpips.LPIPS(net="alex", variant="shift_tolerant")
    for name in set(sys.modules) - before:
        del sys.modules[name]
    assert "torchvision" not in sys.modules
    return module


def test_st_lpips_matches_the_package_and_orders_distortions(package_st_lpips):
    st_lpips = STLPIPS()  # the weights inside the installed wheel: nothing is downloaded
    photo = _photo()
    generator = torch.Generator().manual_seed(0)
    noisy = [(photo + sigma * torch.randn(photo.shape, generator=generator)).clamp(0, 1) for sigma in (0.02, 0.1, 0.3)]
    shifted = photo.roll(1, dims=-1)
    pairs = torch.cat([*noisy, shifted, photo.flip(-1)]), photo.expand(5, -1, -1, -1)
    ours = st_lpips(*pairs)
    with torch.no_grad():
        theirs = package_st_lpips(*pairs, normalize=True).flatten()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert ours[0] < ours[1] < ours[2]  # more noise, larger distance
    # shift tolerance: a one-pixel shift costs more PSNR than noise of sigma 0.1, but less ST-LPIPS
    assert psnr(shifted, photo) < psnr(noisy[1], photo) and ours[3] < ours[1]
    torch.testing.assert_close(st_lpips(photo, photo), torch.zeros(1), rtol=0, atol=0)
    metrics = image_metrics(*pairs, st_lpips=st_lpips)
    assert set(metrics) == {"psnr", "ssim", "st_lpips"}
    torch.testing.assert_close(metrics["st_lpips"], ours)


def test_st_lpips_input_errors(tmp_path):
    st_lpips = STLPIPS(st_lpips_weights())
    with pytest.raises(MetricError, match="at least 24x24"):
        st_lpips(torch.rand(1, 3, 23, 64), torch.rand(1, 3, 23, 64))
    assert available_st_lpips(image_size=23) is None  # too small: hrope eval reports it unavailable
    assert isinstance(available_st_lpips(image_size=24), STLPIPS)
    with pytest.raises(MetricError, match="not found"):
        STLPIPS(tmp_path / "missing.pth")
    torch.save({"lin0.model.1.weight": torch.zeros(1, 64, 1, 1)}, tmp_path / "partial.pth")
    with pytest.raises(MetricError, match="lack"):
        STLPIPS(tmp_path / "partial.pth")


def test_markdown_table_has_an_st_lpips_column_only_when_every_row_has_one():
    old = {"name": "a", "metrics": {"psnr": 20.0, "ssim": 0.5, "lpips": "unavailable"}}
    new = {"name": "b", "metrics": {"psnr": 21.0, "ssim": 0.6, "lpips": "unavailable", "st_lpips": 0.1234}}
    assert (  # results written before LPIPS-VGG existed scored LPIPS-Alex
        markdown_table([old])
        == "| model | PSNR ↑ | SSIM ↑ | LPIPS-Alex ↓ |\n|---|---|---|---|\n| a | 20.00 | 0.500 | unavailable |\n"
    )
    assert markdown_table([new]).splitlines() == [
        "| model | PSNR ↑ | SSIM ↑ | LPIPS-Alex ↓ | ST-LPIPS (alex) ↓ |",
        "|---|---|---|---|---|",
        "| b | 21.00 | 0.600 | unavailable | 0.123 |",
    ]
    assert markdown_table([old, new]).startswith("| model | PSNR ↑ | SSIM ↑ | LPIPS-Alex ↓ |\n")
    vgg = {**new, "lpips_net": "vgg"}
    assert markdown_table([vgg]).startswith("| model | PSNR ↑ | SSIM ↑ | LPIPS-VGG ↓ | ST-LPIPS (alex) ↓ |\n")
    with pytest.raises(MetricError, match=r"different backbones \(alex, vgg\)"):
        markdown_table([old, vgg])
