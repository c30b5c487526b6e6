"""Conformance with upstream bitsandbytes 0.50.2 (CPU): same code maps, same bytes and absmax from
quantize_blockwise, same dequantized values (fixtures: compat_tests/fixtures, made by
tools/make_reference_vectors.py)."""

import numpy as np
import pytest

import mindspore as ms

from bitsandbytes_ms import functional as F
from upstream_vectors import bits, load, to_ms

MAPS = load("code_maps")
BLOCKWISE = load("blockwise_8bit")
CASES = [name for name, (case, _) in BLOCKWISE.items()
         if case["kind"] == "quantize_blockwise" and "error" not in case
         and case["blocksize"] in F.BLOCKWISE_BLOCKSIZES]
# upstream's CPU kernel takes any positive blocksize; we accept powers of two (see BLOCKWISE_BLOCKSIZES)
PROBES = [name for name, (case, _) in BLOCKWISE.items()
          if case["kind"] == "quantize_blockwise" and case["blocksize"] not in F.BLOCKWISE_BLOCKSIZES]

OUR_MAPS = {
    "dynamic_signed": lambda: F.create_dynamic_map(),
    "dynamic_unsigned": lambda: F.create_dynamic_map(signed=False),
    "normal_default": lambda: F.create_normal_map(),
    "normal_no_extra": lambda: F.create_normal_map(0.9677083, False),
    "fp8_default": lambda: F.create_fp8_map(),
    "fp8_e4m3": lambda: F.create_fp8_map(True, 4, 3, 8),
    "linear_signed": lambda: F.create_linear_map(True, 8, True),
    "linear_unsigned": lambda: F.create_linear_map(False, 8, True),
    "fourbit_nf4": lambda: F.get_4bit_type("nf4"),
    "fourbit_fp4": lambda: F.get_4bit_type("fp4"),
    "fourbit_af4": lambda: F.get_4bit_type("af4"),
}


@pytest.mark.parametrize("name", sorted(OUR_MAPS))
def test_code_map_is_upstreams_bit_for_bit(name):
    case, arrays = MAPS[name]
    ours = OUR_MAPS[name]().asnumpy()
    np.testing.assert_array_equal(bits(ours), bits(arrays["code"].astype(np.float32)))


def test_fixture_covers_the_cases_we_rely_on():
    assert len(CASES) >= 100
    assert {BLOCKWISE[c][0]["dtype"] for c in CASES} == {"f32", "f16", "bf16"}
    assert any(BLOCKWISE[c][0]["nested"] for c in CASES)


@pytest.mark.parametrize("name", CASES)
def test_quantize_blockwise_matches_upstream(name):
    case, arrays = BLOCKWISE[name]
    A = BLOCKWISE[case["input"]][1]["A"]
    code = to_ms(arrays["code"]) if "code" in arrays else None
    q, state = F.quantize_blockwise(to_ms(A), code=code, blocksize=case["blocksize"], nested=case["nested"])
    np.testing.assert_array_equal(q.asnumpy(), arrays["q"])
    out = F.dequantize_blockwise(q, state)
    if not case["nested"]:
        np.testing.assert_array_equal(bits(state.absmax.asnumpy()), bits(arrays["absmax"]))
        np.testing.assert_array_equal(bits(out.asnumpy()), bits(arrays["dequant"]))
        return
    # nested: the offset is torch's float32 mean, whose summation order we match to within a few ulps
    # (see functional._mean_f32), so the requantized absmax may move by one code step in rare blocks.
    offset, ref_offset = np.float32(state.offset.asnumpy()), np.float32(arrays["offset"])
    assert abs(int(bits(offset)) - int(bits(ref_offset))) <= 4  # a few ulps: summation order
    if offset == ref_offset:
        np.testing.assert_array_equal(state.absmax.asnumpy(), arrays["absmax"])
        np.testing.assert_array_equal(bits(state.state2.absmax.asnumpy()), bits(arrays["state2_absmax"]))
        np.testing.assert_array_equal(bits(out.asnumpy()), bits(arrays["dequant"]))
    else:
        assert np.mean(state.absmax.asnumpy() != arrays["absmax"]) <= 0.05
        np.testing.assert_allclose(out.asnumpy().astype(np.float32), arrays["dequant"].astype(np.float32),
                                   rtol=0.02, atol=1e-6)


@pytest.mark.parametrize("name", PROBES)
def test_blocksizes_upstream_cpu_also_takes_are_rejected_clearly(name):
    case, _ = BLOCKWISE[name]
    A = BLOCKWISE[case["input"]][1]["A"]
    with pytest.raises(ValueError, match="`blocksize` must be one of"):
        F.quantize_blockwise(to_ms(A), blocksize=case["blocksize"])
