"""Integrity of the upstream quantized-checkpoint fixtures (compat_tests/fixtures/upstream_ckpt).

Numpy only: checks the key layout written by upstream bitsandbytes 0.50.2 + transformers 4.57.1 and that
the storage recipes documented in that README reproduce upstream's own dequantized weights bit-exactly.
(Loading these checkpoints through bitsandbytes_ms is tested with the integration code.)
"""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat_tests", "fixtures", "upstream_ckpt")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
MODULES = [f"model.layers.{i}.{n}" for i in range(2) for n in LINEARS]


@pytest.fixture(scope="module")
def npz():
    with np.load(os.path.join(FIX, "expected_outputs.npz"), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def ckpt():
    return {m: load_file(os.path.join(FIX, m, "model.safetensors")) for m in ("fp32", "int8", "nf4")}


def test_configs_and_meta(npz):
    meta = json.loads(str(npz["__meta__"]))
    assert meta["versions"]["bitsandbytes"] == "0.50.2" and meta["versions"]["transformers"] == "4.57.1"
    q8 = json.load(open(os.path.join(FIX, "int8", "config.json")))["quantization_config"]
    q4 = json.load(open(os.path.join(FIX, "nf4", "config.json")))["quantization_config"]
    assert q8["load_in_8bit"] and q8["llm_int8_threshold"] == 6.0 and q8["quant_method"] == "bitsandbytes"
    assert q4["load_in_4bit"] and q4["bnb_4bit_quant_type"] == "nf4" and q4["bnb_4bit_use_double_quant"]
    assert "quantization_config" not in json.load(open(os.path.join(FIX, "fp32", "config.json")))
    assert npz["input_ids"].shape == (2, 16) and npz["input_ids"].dtype == np.int64
    for k in ("fp32", "int8", "int8_threshold0", "nf4"):
        assert npz[f"logits_{k}"].shape == (2, 16, 256) and np.isfinite(npz[f"logits_{k}"]).all()
    # the outlier decomposition matters on this input, and int8 stays much closer to fp32 than nf4
    assert np.abs(npz["logits_int8"] - npz["logits_int8_threshold0"]).max() > 5 * meta["tolerance"]["int8"]
    assert 0 < np.abs(npz["logits_int8"] - npz["logits_fp32"]).max() < np.abs(npz["logits_nf4"] - npz["logits_fp32"]).max()


def test_int8_layout_and_recipe(ckpt, npz):
    w, q = ckpt["fp32"], ckpt["int8"]
    assert len(q) == 49 and q["lm_head.weight"].dtype == np.float32
    for m in MODULES:
        CB, SCB, fmt = q[m + ".weight"], q[m + ".SCB"], q[m + ".weight_format"]
        W = w[m + ".weight"]
        assert CB.dtype == np.int8 and CB.shape == W.shape and SCB.dtype == np.float32 and SCB.shape == (W.shape[0],)
        assert fmt.dtype == np.uint8 and fmt.shape == () and int(fmt) == 0
        W16 = W.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(SCB, np.abs(W16).max(1))
        # upstream computes `127.0 / row_stats` as torch's rdiv = reciprocal(row_stats) * 127 (not a true
        # fp32 division: they differ by 1 ulp for some rows, flipping a few int8 codes)
        scale = (np.float32(1.0) / SCB[:, None]) * np.float32(127.0)
        np.testing.assert_array_equal(CB, np.round(W16 * scale).astype(np.int8))
        deq = (CB.astype(np.float32) * SCB[:, None]) * np.float32(7.874015718698502e-3)
        np.testing.assert_array_equal(deq, npz["dequant_int8__" + m])


def test_nf4_layout_and_recipe(ckpt, npz):
    w, q = ckpt["fp32"], ckpt["nf4"]
    assert len(q) == 91
    for m in MODULES:
        shape = w[m + ".weight"].shape
        n = shape[0] * shape[1]
        packed, am = q[m + ".weight"], q[m + ".weight.absmax"]
        qmap, nam, nqm = q[m + ".weight.quant_map"], q[m + ".weight.nested_absmax"], q[m + ".weight.nested_quant_map"]
        st = json.loads(q[m + ".weight.quant_state.bitsandbytes__nf4"].tobytes().decode("utf-8"))
        assert packed.dtype == np.uint8 and packed.shape == (n // 2, 1)
        assert am.dtype == np.uint8 and am.shape == (n // 64,)
        assert qmap.shape == (16,) and nqm.shape == (256,) and nam.shape == (1,)
        assert st["quant_type"] == "nf4" and st["blocksize"] == 64 and st["shape"] == list(shape)
        assert st["dtype"] == "float32" and st["nested_blocksize"] == 256 and st["nested_dtype"] == "float32"
        absmax = nqm[am.astype(np.int64)] * nam[np.arange(am.size) // 256] + np.float32(st["nested_offset"])
        b = packed.reshape(-1)
        idx = np.stack([b >> 4, b & 15], 1).reshape(-1)
        deq = (qmap[idx].reshape(-1, 64) * absmax[:, None]).reshape(shape)
        np.testing.assert_array_equal(deq, npz["dequant_nf4__" + m])
