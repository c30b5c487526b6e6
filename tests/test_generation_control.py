"""Negative controls for compat_tests/test_generation.py::test_pi: the check that replaces upstream's
digits-of-pi comparison (greedy continuations of the 4-bit embedded model against the unquantized model's)
must fail for broken 4-bit weights. The ported test itself runs, on a model loaded by its own code and then
damaged: the packed weights decoded with the other 4-bit map, or the weights plus Gaussian noise."""

import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

import mindnlp  # noqa: F401,E402  (torch -> mindtorch)
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat_tests"))
import test_generation as ported  # noqa: E402
from test_generation import reference_continuations  # noqa: E402,F401  (fixture)


def _run_damaged(quant_type, damage, reference_continuations, monkeypatch):
    """test_pi (batched, DQ, fp16 compute) on a model loaded by the port's own code, then damaged."""
    config = (ported.models[0], quant_type)
    model, tokenizer = ported.get_model_and_tokenizer(config)
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            damage(module)
    ported.test_pi((config, model, tokenizer), reference_continuations, False, True, torch.float16, monkeypatch)


def _other_map(module):
    qs = module.weight.quant_state
    qs.code = F.get_4bit_type("fp4" if qs.quant_type == "nf4" else "nf4")


def _noise(scale):
    rng = np.random.RandomState(0)

    def damage(module):
        qs = module.weight.quant_state
        W = F.dequantize_4bit(module.weight, qs).float().numpy()
        W = W + scale * np.abs(W).mean() * rng.standard_normal(W.shape).astype(np.float32)
        packed, new_qs = F.quantize_4bit(torch.tensor(W), blocksize=qs.blocksize, compress_statistics=qs.nested,
                                         quant_type=qs.quant_type)
        module.weight.data = packed
        module.weight.quant_state = new_qs

    return damage


@pytest.mark.slow  # the harness itself passes an undamaged model (compat test_pi covers this case in CI)
def test_undamaged_model_passes(reference_continuations, monkeypatch):
    _run_damaged("nf4", lambda module: None, reference_continuations, monkeypatch)


@pytest.mark.parametrize("quant_type", ["nf4", pytest.param("fp4", marks=pytest.mark.slow)])
def test_pi_fails_with_the_other_4bit_map(quant_type, reference_continuations, monkeypatch):
    with pytest.raises(ValueError, match="Failure count: 6/6"):
        _run_damaged(quant_type, _other_map, reference_continuations, monkeypatch)


# nf4 (failure_max 2): measured 4 failures of 6 at noise 0.3x the mean weight magnitude, 5 at 1.0x
@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.3, 1.0])
def test_pi_fails_with_noisy_weights(scale, reference_continuations, monkeypatch):
    with pytest.raises(ValueError, match="Failure count: [3-6]/6"):
        _run_damaged("nf4", _noise(scale), reference_continuations, monkeypatch)
