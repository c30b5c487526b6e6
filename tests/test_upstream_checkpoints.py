"""Interop with upstream bitsandbytes 0.50.2: checkpoints that upstream quantized and saved (through
transformers' own integration, on CPU) load in bitsandbytes_ms and give upstream's outputs; quantizing
the same fp32 model ourselves gives upstream's bytes. Fixtures: compat_tests/fixtures/upstream_ckpt
(tools/make_upstream_checkpoints.py, which also checks the other direction: --check a directory saved by
bitsandbytes_ms in upstream)."""

import json
from pathlib import Path

import numpy as np
import pytest

import mindnlp  # noqa: F401
import torch  # noqa: E402  (mindtorch)
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402

transformers.logging.set_verbosity_error()
FIX = Path(__file__).resolve().parents[1] / "compat_tests" / "fixtures" / "upstream_ckpt"
EXPECTED = np.load(FIX / "expected_outputs.npz")
META = json.loads(str(EXPECTED["__meta__"]))


@pytest.fixture(scope="module", autouse=True)
def registered():
    bnb.register()


def _logits(model):
    with torch.no_grad():
        return model(torch.tensor(EXPECTED["input_ids"])).logits.float().asnumpy()


def _safetensors(path):
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_upstream_checkpoint_loads_with_upstream_outputs(mode):
    model = AutoModelForCausalLM.from_pretrained(str(FIX / mode), dtype=torch.float32)
    model.eval()
    cls = bnb.nn.Linear8bitLt if mode == "int8" else bnb.nn.Linear4bit
    assert isinstance(model.model.layers[0].mlp.down_proj, cls)
    ref = EXPECTED[f"logits_{mode}"]
    # the fused decoder (the default): within its documented bounds (a prompt's 4-bit layers in bf16 on an
    # AVX512-BF16 CPU, tests/test_fused_bf16_prefill.py; int8: INT8_LOGIT_BOUND of tests/test_fused_decoder.py)
    fused = _logits(model)
    assert bnb.integrations.is_fused(model)
    assert float(np.abs(fused - ref).max()) <= 1e-2 * float(np.abs(ref).max())
    # the layers themselves (unfused): upstream's outputs within the fixture's tolerance
    bnb.integrations.unfuse(model)
    got = _logits(model)
    tol = META["tolerance"][mode]
    diff = float(np.abs(got - ref).max())
    assert diff <= tol, (diff, tol)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.97


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_our_quantization_of_the_fp32_model_saves_upstreams_bytes(mode, tmp_path):
    if mode == "int8":
        cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
    else:
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(FIX / "fp32"), quantization_config=cfg, dtype=torch.float32)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    ours, theirs = _safetensors(tmp_path), _safetensors(FIX / mode)
    assert set(ours) == set(theirs)
    for k, v in theirs.items():
        assert ours[k].dtype == v.dtype and ours[k].shape == v.shape, k
        if k.endswith("quant_state.bitsandbytes__nf4"):
            a, b = json.loads(bytes(ours[k]).decode()), json.loads(bytes(v).decode())
            off_a, off_b = a.pop("nested_offset"), b.pop("nested_offset")
            assert a == b and abs(off_a - off_b) <= 1e-6 * abs(off_b), k
        elif k.endswith("nested_absmax"):
            np.testing.assert_allclose(ours[k], v, rtol=1e-6, err_msg=k)  # the offset's summation order
        else:
            np.testing.assert_array_equal(ours[k], v, err_msg=k)
