"""The AVX2 (and, on machines that have it, AVX-512) 8-bit blockwise optimizer update gives the same
bytes as the portable path: every optimizer rule, fp32/fp16/bf16 parameters, weight decay, a block
tail, zero blocks and NaN gradients. Run in subprocesses with BNB_MS_SIMD lowering the dispatch
level (the level is fixed at library load)."""


import pytest
from simd_levels import assert_levels_agree

_CODE = r"""
import hashlib, sys
import numpy as np, mindspore as ms
ms.set_device('CPU')
import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c
from bitsandbytes_ms import _reference as R
C1, C2 = F.create_dynamic_map(True).asnumpy(), F.create_dynamic_map(False).asnumpy()
HP = {"adam": (0.9, 0.999, 0.0, 0.0, 1e-8, 1e-3), "momentum": (0.9, 0.0, 0.0, 0.0, 1e-8, 1e-2),
      "rmsprop": (0.99, 0.0, 0.0, 0.0, 1e-8, 1e-2), "lion": (0.9, 0.99, 0.0, 0.0, 1e-8, 1e-4),
      "adagrad": (0.0, 0.0, 0.0, 0.0, 1e-10, 1e-2), "ademamix": (0.9, 0.999, 0.9999, 5.0, 1e-8, 1e-3)}
outs = []
for opt, (b1, b2, b3, al, eps, lr) in HP.items():
    for dt in (ms.float32, ms.float16, ms.bfloat16):
        for wd in (0.0, 0.01):
            rng = np.random.RandomState(len(outs))
            n = 256 * 9 + 45
            nb = -(-n // 256)
            mult = 2 if opt == "ademamix" else 1
            P = ms.Tensor(rng.randn(n).astype(np.float32)).astype(dt)
            S1 = ms.Tensor(np.zeros((mult, n) if mult == 2 else (n,), np.uint8))
            A1 = ms.Tensor(np.zeros((mult, nb) if mult == 2 else (nb,), np.float32))
            two = opt in ("adam", "ademamix")
            S2 = ms.Tensor(np.zeros(n, np.uint8)) if two else None
            A2 = ms.Tensor(np.zeros(nb, np.float32)) if two else None
            for step in range(1, 5):
                g = rng.randn(n).astype(np.float32) * 0.1
                g[256:512] = 0  # an all-zero block
                if step == 3:
                    g[700] = np.nan
                F.optimizer_update_8bit_blockwise(opt, ms.Tensor(g).astype(dt), P, S1, S2, b1, b2, b3, al, eps, step,
                                                  lr, ms.Tensor(C1), ms.Tensor(C2) if two else None, A1, A2,
                                                  weight_decay=wd)
                for t in (P.astype(ms.float32), S1, A1) + ((S2, A2) if two else ()):
                    outs.append(t.asnumpy().tobytes())
sys.stdout.write(c.simd_level() + ' ' + hashlib.sha256(b''.join(outs)).hexdigest())
"""


def test_optim8bit_simd_equals_scalar():
    assert_levels_agree(_CODE)


@pytest.mark.parametrize("gather", ["0", "1"])
def test_optim8bit_avx2_lookups_equal_scalar(gather, monkeypatch):
    """Both forms of the AVX2 loop's lookups (scalar loads, vpgatherdd: BNB_MS_AVX2_GATHER; by default gathers on
    Intel CPUs, scalar loads elsewhere) give the portable path's bytes."""
    from simd_levels import run_at
    from bitsandbytes_ms import cextension
    if cextension.simd_level() == "scalar":
        pytest.skip("no AVX2")
    ref = run_at(_CODE, "scalar")[1]
    monkeypatch.setenv("BNB_MS_AVX2_GATHER", gather)
    assert run_at(_CODE, "avx2") == ["avx2", ref]
