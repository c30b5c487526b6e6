"""Issue 35 item 2 (last line): a numpy twin in bitsandbytes_ms/_reference.py, its portable C path and its SIMD paths
share one stem (docs/architecture.md, "Kernel names: one stem per family"). Source text only: no library, no
MindSpore (_reference.py is loaded by path)."""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU = ROOT / "csrc" / "cpu"
ISAS = ("avx2", "avx512", "avx512vbmi", "avx512bf16", "avxvnni", "avx512vnni", "amx")


def _reference():
    spec = importlib.util.spec_from_file_location("_reference_by_path", ROOT / "bitsandbytes_ms" / "_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _code(path):
    """A source file without its comments (names in prose do not count)."""
    return re.sub(r"//[^\n]*", "", path.read_text())


def _sources():
    return {p.name: _code(p) for p in sorted(CPU.iterdir()) if p.suffix in (".cpp", ".h", ".inc")}


# numpy twin -> (file, C dispatcher or None, paths: "<stem>_<suffix>" for each suffix)
FAMILIES = {
    "quantize_blockwise": ("blockwise.cpp", "quantize_blockwise", ("portable", "avx2", "avx512")),
    "dequantize_blockwise": ("blockwise.cpp", "dequantize_blockwise", ("portable", "avx2", "avx512", "avx512vbmi")),
    "quantize_4bit": ("fourbit.cpp", None, ("portable", "avx2", "avx512")),
    "dequantize_4bit": ("fourbit.cpp", None, ("portable", "avx2", "avx512", "row_portable", "row_avx2", "row_avx512")),
    "nested_absmax": ("fourbit.cpp", None, ("portable", "avx2", "avx512", "avx512vbmi")),
    "gemv_4bit": ("fourbit.cpp", "gemv_4bit", ("portable", "avx2", "avx512")),
    "gemv_bf16_rows": ("fourbit.cpp", None, ("portable", "avx512bf16")),
    "dot_rows_bf16": ("fourbit.cpp", None, ("portable", "avx512bf16")),
    "linear_4bit_bf16dot": ("fourbit.cpp", "linear_4bit_bf16dot", ()),
    "fourbit_bounds": ("fourbit.cpp", "fourbit_bounds", ()),
    "bf16_gemv_applies": ("fourbit.cpp", "bf16_gemv_applies", ()),
    "lanes_reduce": ("fourbit.cpp", "lanes_reduce", ()),
    "int8_vector_quant": ("int8.cpp", "int8_vector_quant",
                          ("portable", "avx2", "avx512", "flags_portable", "flags_avx2", "flags_avx512")),
    "int8_mm_dequant": ("int8.cpp", "int8_mm_dequant", ("portable", "avx2", "avx512")),
    "int8_mixed_mm_dequant": ("int8.cpp", "int8_mixed_mm_dequant", ("portable", "avx2", "avx512")),
    "fma_x86": ("int8.cpp", None, ("portable", "avx2", "avx512")),
    "add_x86": ("int8.cpp", None, ("portable", "avx2", "avx512")),
    "mixed_block_size": ("int8.cpp", "mixed_block_size", ()),
    "int8_linear": ("int8.cpp", "int8_linear", ()),
    "int8_gemm": ("int8_gemm.cpp", "int8_gemm",
                  ("tile_portable", "tile_avx2", "tile_avx512", "tile_avxvnni", "tile_avx512vnni", "panel_avx2",
                   "panel_avx512vnni")),
    "gemm_weight_only": ("weightonly.cpp", "gemm_weight_only", ("portable", "avx2", "avx512")),
    "optimizer_update_32bit": ("optim.cpp", "optimizer_update_32bit", ("portable", "avx2", "avx512")),
    "optimizer_update_8bit_blockwise": ("optim.cpp", "optimizer_update_8bit_blockwise",
                                        ("portable", "avx2", "avx512", "avx512vbmi")),
    "gemm_fp": ("gemm_fp.cpp", "gemm_fp", ()),
    "gemm_panel_bf16": ("gemm_panel.cpp", "gemm_panel_bf16", ("portable", "avx512bf16")),
    "linear_spec": ("decoder.cpp", "linear_spec", ()),
    "linear_spec_weight": ("decoder.cpp", "linear_spec_weight", ()),
    "linear4_bf16_gemv_f32": ("fourbit.cpp", "linear4_bf16_gemv_f32", ()),
    "rms_norm": ("decoder.cpp", "rms_norm", ()),
    "pv_chunk_end": ("decoder.cpp", "pv_chunk_end", ()),
    "exp_ms": ("simd_math.h", None, ("portable", "avx2")),
    "softmax_sum": ("simd_math.h", "softmax_sum", ()),
    "square_powf": ("simd_math.h", "square_powf", ()),
    "convert_span": ("simd_convert.h", "convert_span", ("portable", "avx2", "avx512")),
}


def _defines(src, name):
    """``name`` is spelled as a function in src (``name(`` / ``name<...>(``), as a stamping macro's first argument
    or as a struct / class name."""
    return bool(re.search(rf"(^|[\s*&])({re.escape(name)})\s*(<[^()]*>)?\(", src, re.M)
                or re.search(rf"^[A-Z_0-9]+\(\s*{re.escape(name)}\s*,", src, re.M)
                or re.search(rf"\b(struct|class)\s+{re.escape(name)}\b", src))


@pytest.mark.parametrize("stem", sorted(FAMILIES))
def test_family_shares_the_stem_of_its_numpy_twin(stem):
    ref = _reference()
    assert callable(getattr(ref, stem, None)), f"_reference.{stem} is missing"
    fname, dispatcher, suffixes = FAMILIES[stem]
    src = _code(CPU / fname)
    names = ([dispatcher] if dispatcher else []) + [f"{stem}_{s}" for s in suffixes]
    missing = [n for n in names if not _defines(src, n)]
    assert not missing, f"csrc/cpu/{fname} defines none of {missing}"


@pytest.mark.parametrize("fname, stem", [("gemm_fp.cpp", "GemmFp"), ("fourbit.cpp", "Gemv4bit")])
def test_class_paths_are_named_stem_and_isa(fname, stem):
    src = _code(CPU / fname)
    for isa in ("Portable", "Avx2", "Avx512"):
        assert re.search(rf"\bstruct {stem}{isa}\b", src), f"{stem}{isa}"


def test_no_scalar_or_generic_path_names():
    """The portable path is <stem>_portable everywhere (the level `scalar` keeps its name: SimdLevel::scalar,
    GemmPath::scalar and the BNB_MS_SIMD / BNB_MS_INT8_GEMM values)."""
    pat = re.compile(r"\b\w+_(scalar|generic)\b|\b[A-Z]\w*[a-z0-9](Scalar|Generic)\b")
    bad = {f: sorted({m.group(0) for m in pat.finditer(src)}) for f, src in _sources().items()}
    assert not {f: v for f, v in bad.items() if v}


def test_simd_suffix_is_the_target_attribute():
    """A function compiled with BNB_MS_TARGET_<ISA> whose name ends in an ISA ends in that one (lower case)."""
    isa = "|".join(ISAS)
    decl = r"BNB_MS_TARGET_(\w+)\s+(?:BNB_MS_INLINE\s+|static\s+|inline\s+)*[\w:<>*&, ]*?\b(\w+)\s*(?:<[^()]*>)?\("
    stamp = r"^[A-Z_0-9]+\(\s*(\w+),\s*BNB_MS_TARGET_(\w+)"
    wrong = []
    for f, src in _sources().items():
        pairs = [(m.group(1), m.group(2)) for m in re.finditer(decl, src)]
        pairs += [(m.group(2), m.group(1)) for m in re.finditer(stamp, src, re.M)]
        for target, name in pairs:
            m = re.search(rf"_({isa})$", name)
            if m and m.group(1) != target.lower():
                wrong.append((f, name, target))
            if name.endswith("_portable"):
                wrong.append((f, name, target))
    assert not wrong
