"""torch.save / torch.load of quantized layers through mindtorch (issue 15 item 8), in a fresh process that never
calls bitsandbytes_ms.register(): importing bitsandbytes_ms.nn is enough. mindtorch alone has no int8/int16
storage (torch.save raised KeyError: mindspore.int8), no int32 one on load, and turns bfloat16 into float16 on
load (a Params4bit with quant_storage=bfloat16 came back with 1012 of 1024 bytes changed)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import io, json, sys
import numpy as np
import mindspore as ms
ms.set_device("CPU"); ms.runtime.launch_blocking()
import mindnlp  # noqa: F401
import torch
import bitsandbytes_ms.nn as bnn

def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)

def raw(t):
    return t.asnumpy().view(np.uint8).tobytes()

out = {"registered": "bitsandbytes" in sys.modules}
rng = np.random.RandomState(0)
x = torch.tensor(rng.randn(3, 64).astype(np.float32))
res = out["int8"] = {}
for thr in (0.0, 6.0):
    lin = bnn.Linear8bitLt(64, 32, has_fp16_weights=False, threshold=thr).eval().to("cpu")
    xx = x.clone(); xx[:, 5] = 9.0
    y = lin(xx).numpy()
    sd = roundtrip(lin.state_dict())
    fresh = bnn.Linear8bitLt(64, 32, has_fp16_weights=False, threshold=thr).eval()
    fresh.load_state_dict(sd)
    whole = roundtrip(lin)
    res[str(thr)] = dict(
        dtypes={k: str(v.dtype) for k, v in sd.items()},
        bytes_equal=all(raw(v) == raw(lin.state_dict()[k]) for k, v in sd.items()),
        state_dict_output_equal=bool(np.array_equal(fresh(xx).numpy(), y)),
        module_output_equal=bool(np.array_equal(whole.eval()(xx).numpy(), y)))
res = out["4bit"] = {}
for storage in ("uint8", "int8", "int16", "int32", "float16", "bfloat16", "float32"):
    for nested in (False, True):
        qs = getattr(torch, storage)
        lin = bnn.Linear4bit(64, 32, quant_type="nf4", compress_statistics=nested, quant_storage=qs).to("cpu")
        y = lin(x).numpy()
        sd0 = lin.state_dict()
        sd = roundtrip(sd0)
        fresh = bnn.Linear4bit(64, 32, quant_type="nf4", compress_statistics=nested, quant_storage=qs)
        fresh.load_state_dict(sd)
        whole = roundtrip(lin)
        p = roundtrip(lin.weight)
        res[f"{storage}-{int(nested)}"] = dict(
            weight_dtype=str(sd["weight"].dtype),
            changed_bytes=int(np.sum(np.frombuffer(raw(sd["weight"]), np.uint8)
                                     != np.frombuffer(raw(sd0["weight"]), np.uint8))),
            bytes_equal=all(raw(v) == raw(sd0[k]) and v.dtype == sd0[k].dtype for k, v in sd.items()),
            state_dict_output_equal=bool(np.array_equal(fresh(x).numpy(), y)),
            module_output_equal=bool(np.array_equal(whole(x).numpy(), y)),
            param=[type(p).__name__, str(p.dtype), raw(p) == raw(lin.weight), bool(p.bnb_quantized)])
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ)
    env.pop("BNB_MS_SIMD", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_nothing_was_registered(results):
    assert results["registered"] is False


@pytest.mark.parametrize("threshold", ["0.0", "6.0"])
def test_linear8bitlt_round_trips_without_register(results, threshold):
    r = results["int8"][threshold]
    assert r["dtypes"] == {"weight": "mindspore.int8", "bias": "mindspore.float32", "SCB": "mindspore.float32",
                           "weight_format": "mindspore.uint8"}
    assert r["bytes_equal"] and r["state_dict_output_equal"] and r["module_output_equal"], r


@pytest.mark.parametrize("nested", [0, 1])
@pytest.mark.parametrize("storage", ["uint8", "int8", "int16", "int32", "float16", "bfloat16", "float32"])
def test_linear4bit_every_quant_storage_keeps_its_packed_bytes(results, storage, nested):
    r = results["4bit"][f"{storage}-{nested}"]
    assert r["weight_dtype"] == f"mindspore.{storage}", r
    assert r["changed_bytes"] == 0 and r["bytes_equal"], r
    assert r["state_dict_output_equal"] and r["module_output_equal"], r
    assert r["param"] == ["Params4bit", r["weight_dtype"], True, True], r
