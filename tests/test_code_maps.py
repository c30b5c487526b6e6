"""Code maps against upstream's published constants (shared/reference: bitsandbytes_upstream.md §4)."""

import numpy as np
import pytest

from bitsandbytes_ms import functional as F

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]
FP4 = [0.0, 0.005208333, 0.6666667, 1.0, 0.3333333, 0.5, 0.1666667, 0.25,
       0.0, -0.005208333, -0.6666667, -1.0, -0.3333333, -0.5, -0.1666667, -0.25]


def test_nf4_table():
    np.testing.assert_array_equal(F.get_4bit_type("nf4").asnumpy(), np.array(NF4, np.float32))


def test_fp4_table():
    np.testing.assert_allclose(F.get_4bit_type("fp4").asnumpy(), FP4, atol=1e-7)


def test_normal_map_matches_nf4_up_to_float_rounding():
    code = F.create_normal_map().asnumpy()
    values = np.concatenate([code[:8], code[-8:]])
    np.testing.assert_allclose(values, NF4, atol=3e-7)
    assert code.shape == (256,) and np.count_nonzero(code) == 15


def test_dynamic_map_structure():
    code = F.create_dynamic_map().asnumpy()
    assert code.shape == (256,) and len(np.unique(code)) == 256
    assert code.min() == np.float32(-0.99296874) and code.max() == 1.0
    np.testing.assert_allclose(code[124:132], [-7.75e-6, -3.25e-6, -5.5e-7, 0, 5.5e-7, 3.25e-6, 7.75e-6, 2.125e-5],
                               rtol=1e-5)
    unsigned = F.create_dynamic_map(signed=False).asnumpy()
    assert unsigned.min() == 0.0 and unsigned.max() == 1.0
    assert np.isclose(unsigned[unsigned > 0].min(), 3.25e-7, rtol=1e-5)


def test_af4_only_blocksize_64():
    assert F.get_4bit_type("af4", blocksize=64).shape == (16,)
    with pytest.raises(NotImplementedError):
        F.get_4bit_type("af4", blocksize=128)
    with pytest.raises(NotImplementedError):
        F.get_4bit_type("nf5")


def test_fp8_map_checks_bits():
    with pytest.raises(ValueError, match="must equal total_bits"):
        F.create_fp8_map(True, 4, 4, 8)
