"""Optimizer constructors and base-class methods have upstream bitsandbytes 0.50.2's signatures: same
parameter names, order, kinds and defaults, so positional calls written for upstream land on the same
parameter. The reference is compat_tests/fixtures/upstream_optim_signatures.json, recorded from the
upstream package by tools/record_optim_signatures.py."""

import inspect
import json
from pathlib import Path

import pytest

import bitsandbytes_ms as bnb
from bitsandbytes_ms.optim.optimizer import Optimizer8bit

FIXTURE = Path(__file__).resolve().parents[1] / "compat_tests" / "fixtures" / "upstream_optim_signatures.json"
UPSTREAM = json.loads(FIXTURE.read_text())


def _describe(fn):
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]


def test_fixture_is_upstream_0_50_2():
    assert UPSTREAM["bitsandbytes"] == "0.50.2"
    assert len(UPSTREAM["classes"]) >= 40 and "AdamW8bit" in UPSTREAM["classes"]


@pytest.mark.parametrize("name", sorted(UPSTREAM["classes"]))
def test_class_signature_matches_upstream(name):
    ours = getattr(bnb.optim, name, None)
    assert ours is not None, f"bitsandbytes_ms.optim lacks upstream's {name}"
    assert _describe(ours.__init__) == UPSTREAM["classes"][name]


@pytest.mark.parametrize("method", sorted(UPSTREAM["Optimizer8bit_methods"]))
def test_base_method_signature_matches_upstream(method):
    ours = getattr(Optimizer8bit, method, None)
    assert ours is not None, f"Optimizer8bit lacks upstream's {method}"
    rows = _describe(ours)
    want = UPSTREAM["Optimizer8bit_methods"][method]
    if method == "get_state_buffer":  # the dtype default is the framework's float32 (torch.float32 upstream)
        rows, want = rows[:2] + [r[:2] for r in rows[2:]], want[:2] + [r[:2] for r in want[2:]]
    assert rows == want
