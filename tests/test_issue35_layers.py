"""Issue 35 item 1 (first part): the import graph of bitsandbytes_ms/ has no circles, QuantState has its own module
(still upstream's ``functional.QuantState``), and C entry-point names are chosen by one function per format in
``backends/native.py``."""

import ast
import pathlib
import pickle

import numpy as np
import pytest
import mindspore as ms

mindspore = ms
mindspore.set_device("CPU")

import bitsandbytes_ms  # noqa: E402
from bitsandbytes_ms import _native_table, _ops, functional as F, quant_state  # noqa: E402
from bitsandbytes_ms.backends import native  # noqa: E402

PKG = pathlib.Path(bitsandbytes_ms.__file__).parent


def _modules():
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = ("bitsandbytes_ms",) + path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _import_edges():
    """{(importer, imported): {"top"|"lazy"}} between this package's modules (lazy: inside a function)."""
    mods, edges = _modules(), {}

    def known(name):
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None

    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]

        def visit(node, lazy):
            for ch in ast.iter_child_nodes(node):
                inner = lazy or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(ch, ast.Import):
                    targets = [a.name for a in ch.names]
                elif isinstance(ch, ast.ImportFrom):
                    base = ch.module or ""
                    if ch.level:
                        up = pkg.split(".")[:len(pkg.split(".")) - ch.level + 1]
                        base = ".".join(up + ([ch.module] if ch.module else []))
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in ch.names]
                for t in filter(None, map(known, targets)):
                    if t != mod:
                        edges.setdefault((mod, t), set()).add("lazy" if inner else "top")
                visit(ch, inner)
        visit(ast.parse(path.read_text()), False)
    return edges


def _circles(edges, kinds):
    """The strongly connected components (more than one module) of the edges of ``kinds``."""
    graph = {}
    for (a, b), k in edges.items():
        if k & kinds:
            graph.setdefault(a, set()).add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_the_edge_finder_sees_the_known_imports():
    edges = _import_edges()
    assert edges[("bitsandbytes_ms.functional", "bitsandbytes_ms._graph")] == {"top"}
    assert edges[("bitsandbytes_ms.functional", "bitsandbytes_ms.quant_state")] == {"top"}
    assert edges[("bitsandbytes_ms.backends.native", "bitsandbytes_ms._ops")] == {"top"}
    assert "lazy" in edges[("bitsandbytes_ms._graph", "bitsandbytes_ms.backends.native")]
    # and would find a circle: these two edges form one
    assert _circles({("a", "b"): {"top"}, ("b", "a"): {"lazy"}}, {"top", "lazy"}) == [{"a", "b"}]


def test_no_import_circle_at_module_level():
    assert _circles(_import_edges(), {"top"}) == []


def test_lazy_import_circles_are_only_the_known_one():
    # the package's register() imports integrations.hf, which reads the package's version; _graph takes the dynamic
    # 8-bit map from _formats_common, so it never imports functional (which imports it)
    found = sorted(sorted(c) for c in _circles(_import_edges(), {"top", "lazy"}))
    assert found == [["bitsandbytes_ms", "bitsandbytes_ms.integrations.hf"]]
    edges = _import_edges()
    assert ("bitsandbytes_ms._graph", "bitsandbytes_ms.functional") not in edges


def test_op_layer_imports_no_backend_and_every_op_has_its_kernels():
    edges = _import_edges()
    assert not [b for (a, b) in edges if a == "bitsandbytes_ms._ops" and b.startswith("bitsandbytes_ms.backends")]
    for name, op in _ops.OPS.items():
        assert {"cpu", "cuda", "reference"} <= set(op.kernels), name


def test_quant_state_is_functional_quant_state_and_pickles():
    assert F.QuantState is quant_state.QuantState
    A = ms.Tensor(np.random.RandomState(0).randn(8, 64).astype(np.float32))
    q, st = F.quantize_4bit(A, blocksize=64, quant_type="nf4", compress_statistics=True)
    back = pickle.loads(pickle.dumps(st))
    assert isinstance(back, F.QuantState) and back == st
    np.testing.assert_array_equal(F.dequantize_4bit(q, back).asnumpy(), F.dequantize_4bit(q, st).asnumpy())
    assert F.QuantState.from_dict(st.as_dict(packed=True)) == st


def _all_names():
    f = (ms.float32, ms.float16, ms.bfloat16)
    names = [native.blockwise_name(k, d) for k in ("quantize", "dequantize") for d in f]
    names += [native.fourbit_name(k, d, qt) for k in ("quantize", "dequantize") for d in f for qt in ("nf4", "fp4")]
    names += [native.fourbit_name(k, d) for k in ("gemv", "linear") for d in f]
    names += [native.fourbit_name("linear", ms.bfloat16, bf16_dot=True)]
    names += [native.int8_name("vector_quant"), native.int8_name("matmul")]
    names += [native.int8_name(k, d) for k in ("mm_dequant", "mixed_mm_dequant", "linear") for d in f]
    names += [native.weight_only_name(k, d, b) for k in ("quantize", "dequantize", "gemm") for d in f for b in (4, 8)]
    names += [native.gemm_fp_name(d) for d in f]
    return names


def test_namers_give_rows_of_the_c_abi_table():
    names = _all_names()
    assert len(names) == len(set(names)) == 57
    missing = [n for n in names if n not in _native_table.OPS]
    assert missing == []
    # the spellings the sites used before (the bytes of the names are unchanged)
    assert native.blockwise_name("quantize", ms.float16) == "cquantize_blockwise_fp16"
    assert native.fourbit_name("dequantize", ms.bfloat16, "fp4") == "cdequantize_blockwise_bf16_fp4"
    assert native.fourbit_name("gemv", ms.float32) == "cgemm_4bit_inference_naive_fp32"
    assert native.fourbit_name("linear", ms.float16) == native.linear_4bit_name(ms.float16) == "clinear_4bit_fp16"
    assert native.linear_4bit_name(ms.bfloat16, True) == "clinear_4bit_bf16dot_bf16"
    assert native.int8_name("matmul") == "cigemmlt_32"
    assert native.int8_name("mm_dequant", ms.float16) == "cdequant_mm_int32_fp16"
    assert native.weight_only_name("dequantize", ms.float32, 4) == "cdequantize_weight_only_int4_fp32"
    assert native.gemm_fp_name(ms.bfloat16) == "cgemm_fp_bf16"
    assert [native.decoder_entry(p, d).name for p, d in (("attention", False), ("mlp", True), ("linear", True),
                                                        ("rms_norm", False))] == [
        "cdecoder_attention_fp32", "cdecoder_mlp_fp32_bf16dot", "cdecoder_linear_fp32_bf16dot", "crms_norm_fp32"]


@pytest.mark.parametrize("call, words", [
    (lambda: native.blockwise_name("gemv", ms.float32), "`kind`"),
    (lambda: native.fourbit_name("quantize", ms.float32, "int4"), "`quant_type`"),
    (lambda: native.int8_name("gemm", ms.float32), "`kind`"),
    (lambda: native.weight_only_name("gemm", ms.float32, 2), "`bits`"),
    (lambda: native.decoder_entry("lm_head"), "`part`"),
    (lambda: native.decoder_entry("rms_norm", True), "`bf16_dot`"),
])
def test_namers_name_a_bad_argument(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_no_c_symbol_spelled_outside_backends():
    """String literals (not docstrings) equal to, or f-strings starting like, a C ABI table row, outside
    backends/ and the table itself."""
    names, found = set(_native_table.OPS), []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("backends/") or rel == "_native_table.py":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs:
                found.append((rel, node.lineno, node.value))
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                head = node.values[0].value
                if len(head) > 2 and head.startswith("c") and any(n.startswith(head) for n in names):
                    found.append((rel, node.lineno, head))
    assert found == []


# ---- the 4-bit format's one door (formats/fourbit.py) ----
from bitsandbytes_ms.formats import fourbit  # noqa: E402


def _linear4bit_source_names():
    """Every dotted name the Linear4bit class body reads (``_fourbit.linear``, ``_F.FLOAT_DTYPES``, ...)."""
    tree = ast.parse((PKG / "nn" / "modules.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Linear4bit")
    return {ast.unparse(n) for n in ast.walk(cls) if isinstance(n, ast.Attribute)}


def test_linear4bit_calls_one_door_and_chooses_no_kernel():
    names = _linear4bit_source_names()
    assert "_fourbit.linear" in names
    kernel_level = [n for n in names if n.split(".")[0] in ("_hostcall", "_graph", "_ops", "_native")
                    or n in ("_F.linear_4bit", "_F.linear_4bit_compute") or "plan" in n or "_linear_plan" in n]
    assert kernel_level == []


def test_functional_names_are_the_format_modules():
    assert F._Linear4bitPlan is fourbit.Linear4bitPlan
    for name in ("linear_4bit_compute", "set_bf16_dot", "bf16_dot_enabled", "bf16_gemv_applies", "_plan_4bit",
                 "_check_4bit_sizes", "_4bit_size_errors", "_use_bf16_dot"):
        assert getattr(F, name) is getattr(fourbit, name), name
    assert F.BF16_DOT_AUTO_MIN_ROWS == fourbit.BF16_DOT_AUTO_MIN_ROWS == 2


def test_route_is_decided_by_the_dtypes():
    f32, f16, b16 = ms.float32, ms.float16, ms.bfloat16
    assert fourbit._route_of(f32, None, None) is fourbit._route_same
    assert fourbit._route_of(b16, b16, b16) is fourbit._route_same
    assert fourbit._route_of(f32, b16, b16) is fourbit._route_compute
    assert fourbit._route_of(f32, f16, None) is fourbit._route_compute
    assert fourbit._route_of(f32, b16, f32) is fourbit._route_cast_bias  # the bias parameter is cast once (upstream)
    assert fourbit._route_of(f16, f32, None) is fourbit._route_autograd  # the autograd form, as upstream
    assert fourbit._route_of(ms.int32, None, None) is fourbit._route_autograd


def test_the_4bit_format_holds_its_public_functions_graph_forms_and_autograd_form():
    """One door per format: functional, autograd and _graph hold no 4-bit code of their own (re-exports only)."""
    from bitsandbytes_ms import _graph
    from bitsandbytes_ms.autograd import _functions as AF
    for name in ("quantize_4bit", "dequantize_4bit", "gemv_4bit", "linear_4bit", "quantize_nf4", "dequantize_fp4"):
        assert getattr(F, name) is getattr(fourbit, name), name
    assert AF.MatMul4Bit is fourbit.MatMul4Bit and AF.matmul_4bit is fourbit.matmul_4bit
    assert bitsandbytes_ms.matmul_4bit is fourbit.matmul_4bit
    for name in ("quantize_4bit", "dequantize_4bit", "gemv_4bit", "linear_4bit", "forward_4bit", "grad_4bit"):
        assert not hasattr(_graph, name), name
        assert callable(getattr(fourbit, "graph_" + name)), name


def _layer(compute_dtype, K=64, N=48, seed=0):
    import mindtorch as torch
    import bitsandbytes_ms.nn as bnn
    rng = np.random.RandomState(seed)
    layer = bnn.Linear4bit(K, N, compute_dtype=compute_dtype, quant_type="nf4")
    layer.weight = bnn.Params4bit(torch.tensor((rng.randn(N, K) * 0.1).astype(np.float32)), requires_grad=False,
                                  quant_type="nf4")
    layer.bias = torch.nn.Parameter(torch.tensor(rng.randn(N).astype(np.float32)), requires_grad=False)
    return layer.to("cpu").eval(), torch.tensor(rng.randn(3, K).astype(np.float32)) + 0.0


@pytest.mark.parametrize("cdt, route", [(ms.float32, "_route_same"), (ms.bfloat16, "_route_compute")])
def test_plan_records_the_route_once_and_the_door_keeps_the_bytes(monkeypatch, cdt, route):
    import mindtorch as torch
    layer, x = _layer(cdt)
    asked = []
    decide = fourbit._route_of
    monkeypatch.setattr(fourbit, "_route_of", lambda *a: asked.append(a) or decide(*a))
    with torch.no_grad():
        outs = [layer(x).float().asnumpy() for _ in range(4)]
    qs = layer.weight.quant_state
    plan = qs.__dict__["_linear_plan"]
    assert [(r[0], r[1], r[3].__name__) for r in plan.routes] == [(ms.float32, cdt, route)]
    # asked on the first call (no plan yet: the bias is still fp32 for a bf16 compute dtype, then once more after
    # the layer cast it), then once for the plan, and never again
    assert len(asked) == (1 if cdt == ms.float32 else 2) + 1
    if cdt == ms.float32:
        want = F.linear_4bit(x, layer.weight, qs, layer.bias).asnumpy()
    else:
        assert layer.bias.dtype == ms.bfloat16  # upstream casts the bias parameter itself, once
        want = F.linear_4bit_compute(x, layer.weight, qs, layer.bias, ms.bfloat16).asnumpy()
    ref = F.dequantize_4bit(layer.weight, qs).asnumpy()
    np.testing.assert_allclose(want, x.asnumpy() @ ref.T + layer.bias.float().asnumpy(), rtol=2e-2, atol=2e-2)
    for out in outs:
        np.testing.assert_array_equal(out, want)


def test_door_serves_long_inputs_and_gradients_through_the_autograd_form():
    """The layer calls the door alone: what no host call serves (more than LINEAR_4BIT_MAX_ROWS rows, a gradient
    recorded) is the door's autograd route, with matmul_4bit's bytes."""
    import mindtorch as torch
    layer, x = _layer(ms.float32)
    qs = layer.weight.quant_state
    with torch.no_grad():
        layer(x)  # the plan and its lean record
        long_x = torch.tensor(np.random.RandomState(1).randn(F.LINEAR_4BIT_MAX_ROWS + 1, 64).astype(np.float32))
        got = fourbit.linear(long_x, layer.weight, qs, layer.bias, ms.float32)
        want = bitsandbytes_ms.matmul_4bit(long_x, layer.weight.t(), quant_state=qs, bias=layer.bias)
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
        np.testing.assert_array_equal(layer(long_x).asnumpy(), want.asnumpy())
    taken = []
    real = fourbit._route_autograd

    def autograd_route(*args):
        taken.append(1)
        return real(*args)

    fourbit_routes = qs.__dict__["_linear_plan"].routes
    assert [r[3] for r in fourbit_routes] == [fourbit._route_same]

    def f(t):  # under ms.grad: a gradient is recorded, no host call may run; the same route, its autograd fallback
        return fourbit.linear(t, layer.weight, qs, layer.bias, ms.float32).sum()

    import pytest as _pytest
    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(fourbit, "_route_autograd", autograd_route)
        g = ms.grad(f)(ms.Tensor(x.asnumpy()))
    assert taken == [1]
    W = F.dequantize_4bit(layer.weight, qs).asnumpy()
    np.testing.assert_allclose(g.asnumpy(), np.ones((3, 48), np.float32) @ W, rtol=1e-5, atol=1e-5)


def test_door_serves_an_empty_x_of_the_compute_route():
    """An empty fp32 x with a 16-bit compute dtype: no host call serves it (linear_4bit_compute has nothing to run), so
    the door runs the autograd form, whose empty result has the layer's width and x's dtype (the route once handed
    back None)."""
    import mindtorch as torch
    layer, x = _layer(ms.bfloat16)
    with torch.no_grad():
        layer(x)
        y = layer(torch.tensor(np.zeros((0, 64), np.float32)))
    assert tuple(y.shape) == (0, 48) and y.dtype == ms.float32


def test_door_raises_the_layers_error_for_another_width():
    import mindtorch as torch
    layer, x = _layer(ms.float32)
    with torch.no_grad():
        layer(x)
        with pytest.raises(ValueError, match=r"Linear4bit: `x` must have last dimension 64 \(in_features\)"):
            layer(torch.tensor(np.ones((2, 48), np.float32)))


def test_bias_cast_route_checks_x_first_and_casts_the_parameter_once():
    import mindtorch as torch
    layer, x = _layer(ms.bfloat16)
    bias = layer.bias
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"Linear4bit: `x` must have last dimension 64"):
            layer(torch.tensor(np.ones((2, 48), np.float32)))
        assert layer.bias is bias and bias.dtype == ms.float32  # a refused x leaves the bias as it was
        out = layer(x).float().asnumpy()
        assert layer.bias is bias and bias.dtype == ms.bfloat16  # the parameter itself, cast once (upstream)
        np.testing.assert_array_equal(layer(x).float().asnumpy(), out)


def test_layer_without_a_quant_state_says_so():
    import mindtorch as torch
    layer, x = _layer(ms.float32)
    layer.weight.quant_state = None
    layer.quant_state = None
    with torch.no_grad(), pytest.raises(ValueError, match="quant_state is required"):
        layer(x)
