"""LLM.int8() outlier columns against upstream bitsandbytes 0.50.2's own forward, bit for bit.

compat_tests/fixtures/int8_mixed.npz (tools/make_reference_vectors.py --only int8_mixed) holds upstream's
``Linear8bitLt`` (has_fp16_weights=False, eval) fp32 forward on CPU for 6-37 rows with 3, 12, 200 and 420
outlier columns (threshold 6.0, one element exactly 6.0), with and without bias: the fp32 weight, upstream's
CB/SCB, ``state.idx`` and the output.  Upstream adds the outlier columns with torch's fp32 ``addmm``: per
output, fma over the outlier columns in ascending order from 0, in blocks of 192 columns (two halves for
192 < count < 384), each block's sum added to the int8 part.  Before this was reproduced, the outlier sum was
a plain multiply-then-add chain and differed from upstream in the last bit of many outputs (e.g. 15544 of
147456 outputs of SmolLM2-135M's layer-0 down_proj), which the model's later int8 layers amplified.
"""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms

import bitsandbytes_ms as bnb

bnb.register()

import torch  # noqa: E402  (mindtorch)

import bitsandbytes_ms.functional as F  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms.autograd import _functions as AF  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "compat_tests" / "fixtures" / "int8_mixed.npz"


def _cases():
    with np.load(FIXTURE, allow_pickle=False) as z:
        out = []
        for c in (json.loads(s) for s in z["__cases__"]):
            out.append((c, {f: z[f"{c['name']}__{f}"] for f in c["fields"]}))
        return out


CASES = _cases()
IDS = [c["name"] for c, _ in CASES]


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _layer(c, f):
    lin = bnb.nn.Linear8bitLt(c["K"], c["N"], bias=c["bias"], has_fp16_weights=False, threshold=6.0)
    lin.weight = bnb.nn.Int8Params(torch.tensor(f["W"]), requires_grad=False, has_fp16_weights=False)
    if c["bias"]:
        lin.bias = torch.nn.Parameter(torch.tensor(f["bias"]), requires_grad=False)
    return lin.eval()


def test_fixture_covers_the_blocks():
    counts = sorted(int(f["idx"].size) for _, f in CASES)
    assert counts[0] <= 192 < counts[-2] < 384 <= counts[-1]  # one block, two halves, 192-column blocks


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reference_equals_upstream(case):
    c, f = case
    out, flags = R.int8_linear(f["A"], f["CB"], f["SCB"], f.get("bias"), 6.0, "float32")
    np.testing.assert_array_equal(np.nonzero(flags)[0], f["idx"])
    assert np.array_equal(_bits(out), _bits(f["out"])), int((_bits(out) != _bits(f["out"])).sum())


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear8bitlt_equals_upstream(case, fused, monkeypatch):
    c, f = case
    monkeypatch.setattr(AF, "FUSED_INFERENCE", fused)
    lin = _layer(c, f)
    with torch.no_grad():
        y = lin(torch.tensor(f["A"])).asnumpy()
    np.testing.assert_array_equal(lin.state.CB.asnumpy(), f["CB"])
    assert np.array_equal(_bits(lin.state.SCB.asnumpy()), _bits(f["SCB"]))
    np.testing.assert_array_equal(lin.state.idx.asnumpy(), f["idx"])
    assert y.shape == f["out"].shape
    assert np.array_equal(_bits(y), _bits(f["out"])), int((_bits(y) != _bits(f["out"])).sum())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_functional_mixed_scaled_mm_equals_upstream(case):
    c, f = case
    A = torch.tensor(f["A"])
    CA, SCA, cols = F.int8_vectorwise_quant(A.half(), threshold=6.0)
    np.testing.assert_array_equal(cols.asnumpy(), f["idx"])
    bias = torch.tensor(f["bias"]) if c["bias"] else None
    out, subA = F.int8_mixed_scaled_mm(A, CA, torch.tensor(f["CB"]), SCA, torch.tensor(f["SCB"]), cols, bias)
    assert np.array_equal(_bits(out.asnumpy()), _bits(f["out"]))
    np.testing.assert_array_equal(subA.asnumpy(), f["A"][:, f["idx"]])


def _exact_fma(a, b, c):
    return Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))


def _round_f32(x: Fraction) -> np.float32:
    """x rounded to the nearest float32 (ties to even), for finite in-range x."""
    f = np.float32(float(x))  # float64 rounding first: may be off by one ulp at a float32 tie
    best = f
    for cand in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):
        d, db = abs(Fraction(float(cand)) - x), abs(Fraction(float(best)) - x)
        if d < db or (d == db and (int(_bits(cand)) & 1) == 0):
            best = cand
    return best


def test_fma_x86_rounds_once():
    rng = np.random.default_rng(7)
    a = rng.standard_normal(4000).astype(np.float32)
    b = rng.standard_normal(4000).astype(np.float32)
    c = (rng.standard_normal(4000) * 4).astype(np.float32)
    # planted float64 ties: c = -(a*b) rounded to float32 plus half an ulp patterns
    a[:8] = np.float32(1 + 2 ** -12)
    b[:8] = np.float32(1 + 2 ** -12)           # a*b = 1 + 2^-11 + 2^-24: exactly a float32 midpoint + 0
    c[:8] = np.float32(2 ** -60) * np.array([1, -1, 0, 1, -1, 0, 1, -1], np.float32)  # breaks the tie
    got = R.fma_x86(a, b, c)
    want = np.array([_round_f32(_exact_fma(x, y, z)) for x, y, z in zip(a, b, c)], np.float32)
    assert np.array_equal(_bits(got), _bits(want))
    # and it differs from two roundings where it should
    two = (a * b + c).astype(np.float32)
    assert (two != got).any()


def test_fma_x86_nan_and_inf():
    nan = np.float32(np.nan)
    got = R.fma_x86(np.array([np.inf, 1.0, 1e30, nan], np.float32), np.array([0.0, 2.0, 1e30, 1.0], np.float32),
                    np.array([1.0, np.inf, -np.inf, 2.0], np.float32))
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf and np.isnan(got[3])


@pytest.mark.parametrize("n", [1, 3, 20])
def test_add_x86_and_fma_x86_give_the_first_nan(n):
    """Where both operands are NaN the result is the first's (x86's rule; numpy's own ``a + b`` gives the second's
    in its SIMD loop, the first's in its scalar one, hence the explicit twin): the outlier sums' NaN sign does not
    depend on the array length or on how the compiler orders an add."""
    pos = np.full(n, np.nan, np.float32)                                   # 0x7fc00000
    neg = np.full(n, 0xFFC00000, np.uint32).view(np.float32)               # x86's default NaN
    assert (_bits(R.add_x86(pos, neg)) == 0x7FC00000).all()
    assert (_bits(R.add_x86(neg, pos)) == 0xFFC00000).all()
    assert (_bits(R.add_x86(np.ones(n, np.float32), neg)) == 0xFFC00000).all()
    inf = np.full(n, np.inf, np.float32)
    assert (_bits(R.add_x86(inf, -inf)) == 0xFFC00000).all()
    # acc already NaN (+), then inf * 0 (the default NaN): the acc's NaN stays
    assert (_bits(R.fma_x86(inf, np.zeros(n, np.float32), pos)) == 0x7FC00000).all()
    assert (_bits(R.fma_x86(inf, np.zeros(n, np.float32), np.ones(n, np.float32))) == 0xFFC00000).all()
