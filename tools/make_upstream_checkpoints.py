#!/usr/bin/env python3
"""Quantized-checkpoint interop fixtures made with upstream bitsandbytes 0.50.2 + transformers 4.57.1 (CPU).

Two modes:

``generate`` (default)
    Builds a small Llama (vocab 256, hidden 64, intermediate 128, 2 layers, 4 heads, untied embeddings)
    with fixed weights, saves it in fp32, then loads that directory back through transformers' own
    bitsandbytes integration (``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))``) as
    LLM.int8() (threshold 6.0) and as NF4 with double quantization (compute dtype fp32), and
    ``save_pretrained``s each quantized model (safetensors).  Writes::

        compat_tests/fixtures/upstream_ckpt/{fp32,int8,nf4}/{config.json,model.safetensors}
        compat_tests/fixtures/upstream_ckpt/expected_outputs.npz

    ``expected_outputs.npz`` holds the fixed ``input_ids`` and the logits of each upstream model on
    them, the dequantized weight of every quantized Linear, and a few diagnostics (see the README).

``--check DIR --expect NPZ``
    Loads a checkpoint directory (same layout, e.g. one saved by bitsandbytes_ms) with upstream
    ``from_pretrained``, runs the npz's ``input_ids`` and compares the logits with the npz's
    ``logits_<mode>`` (mode taken from DIR's quantization_config unless ``--key`` is given).  Prints the
    max abs diff, the tolerance and PASS/FAIL; exit status 0 on PASS, 1 on FAIL.  With ``--ref DIR2``
    it also compares every tensor of DIR's safetensors with DIR2's (key sets, dtypes, shapes, bytes).

Usage (from the repository root, any Python 3.11; the script never imports bitsandbytes_ms)::

    python tools/make_upstream_checkpoints.py                       # (re)generate the fixtures
    python tools/make_upstream_checkpoints.py --check compat_tests/fixtures/upstream_ckpt/int8 \\
        --expect compat_tests/fixtures/upstream_ckpt/expected_outputs.npz \\
        --ref compat_tests/fixtures/upstream_ckpt/int8

Run with the project interpreter, the script creates (once) a throwaway venv at
``~/.cache/bitsandbytes_ms/upstream-hf-env`` (a sibling of tools/make_reference_vectors.py's
``upstream-env``) with the pinned stack below and re-executes itself inside it with ``--inside``.
torch stays pinned to 2.13.0 (its CPU wheel is on local disk; pip must never pick another torch).
Deterministic: seeds are fixed, torch runs single-threaded, the npz is written with fixed zip
timestamps, safetensors files are byte-stable, so a re-run reproduces the committed files.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "compat_tests", "fixtures", "upstream_ckpt")
ENV_DIR = os.path.join(os.path.expanduser("~"), ".cache", "bitsandbytes_ms", "upstream-hf-env")
PINS = [
    "torch==2.13.0",
    "bitsandbytes==0.50.2",
    "numpy<2",
    "scipy",
    "transformers==4.57.1",
    "tokenizers==0.22.2",
    "safetensors==0.7.0",
    "accelerate==1.15.0",
]
STAMP = ".bnbms-pins.json"

# model / data constants (also recorded in the npz meta)
MODEL_CFG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
TORCH_SEED = 1234
INPUT_SEED = 0
INPUT_SHAPE = (2, 16)
# hidden channels whose RMSNorm gain is set large, so normalised activations exceed the 6.0 threshold
OUTLIER_CHANNELS = (3, 17, 42)
OUTLIER_GAIN = 8.0
MLP_SCALE = 0.5
QUANT_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# relative perturbation used to measure each model's sensitivity to fp32 rounding (see README)
NOISE_REL = 1e-6
NOISE_TRIALS = 4


# --------------------------------------------------------------------------------------
# outer part: environment management (runs with any python 3.11, no torch needed)
# --------------------------------------------------------------------------------------


def env_python() -> str:
    return os.path.join(ENV_DIR, "bin", "python")


def env_is_ready() -> bool:
    stamp = os.path.join(ENV_DIR, STAMP)
    if not (os.path.exists(env_python()) and os.path.exists(stamp)):
        return False
    try:
        with open(stamp) as f:
            return json.load(f).get("pins") == PINS
    except (OSError, ValueError):
        return False


def ensure_env() -> None:
    if env_is_ready():
        return
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("the torch 2.13.0 CPU wheel is cp311: run this script with Python 3.11")
    t0 = time.time()
    if os.path.exists(ENV_DIR):
        shutil.rmtree(ENV_DIR)
    os.makedirs(os.path.dirname(ENV_DIR), exist_ok=True)
    print(f"[make_upstream_checkpoints] creating {ENV_DIR} ...", flush=True)
    subprocess.check_call([sys.executable, "-m", "venv", ENV_DIR])
    # all pins in ONE pip call: torch==2.13.0 is a hard pin, so no dependency can pull another torch.
    subprocess.check_call([env_python(), "-m", "pip", "install", "-q", *PINS])
    with open(os.path.join(ENV_DIR, STAMP), "w") as f:
        json.dump({"pins": PINS}, f)
    print(f"[make_upstream_checkpoints] env created in {time.time() - t0:.1f}s", flush=True)


def outer_main(argv) -> int:
    ensure_env()
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TORCHDYNAMO_DISABLE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONHASHSEED="0",
    )
    env.pop("PYTHONPATH", None)  # never let the project's mindtorch shadow real torch
    return subprocess.call([env_python(), os.path.abspath(__file__), "--inside", *argv], env=env)


# --------------------------------------------------------------------------------------
# inner part: runs inside the upstream venv
# --------------------------------------------------------------------------------------


def _write_npz(path: str, arrays: dict) -> None:
    """np.savez_compressed with fixed member order and zip timestamps (byte-reproducible)."""
    import numpy as np

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in arrays:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def _quant_configs():
    import torch
    from transformers import BitsAndBytesConfig

    return {
        "int8": BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0),
        "nf4": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        ),
    }


def _load(path, quantization_config=None):
    """Upstream's supported CPU load: device_map={"": "cpu"}, fp32 for the non-quantized parameters.

    Without ``dtype`` transformers 4.57 overrides it to float16 for bitsandbytes models; we want fp32
    (embeddings, norms, lm_head, activations) so the fixture tests quantization, not fp16 rounding.
    ``attn_implementation="eager"`` keeps attention a plain matmul/softmax sequence.
    """
    import torch
    from transformers import AutoModelForCausalLM

    kw = dict(device_map={"": "cpu"}, dtype=torch.float32, attn_implementation="eager")
    if quantization_config is not None:
        kw["quantization_config"] = quantization_config
    model = AutoModelForCausalLM.from_pretrained(path, **kw)
    model.eval()
    return model


def _logits(model, input_ids):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(input_ids).long(), use_cache=False)
    return out.logits.float().numpy()


def _sensitivity(model, input_ids, seed):
    """Max |logit change| when every Linear input is perturbed by ~NOISE_REL relative noise.

    This is the size of difference a different (but correct) fp32 summation order can cause: for int8
    it includes flips of activation-quantization rounding, which fp32 noise alone can trigger.
    """
    import numpy as np
    import torch

    base = _logits(model, input_ids)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0

    def pre_hook(mod, args):
        x = args[0]
        noise = torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.dtype)
        return (x * (1 + NOISE_REL * noise),) + tuple(args[1:])

    handles = [m.register_forward_pre_hook(pre_hook) for n, m in model.named_modules() if n.split(".")[-1] in QUANT_LINEARS]
    try:
        for _ in range(NOISE_TRIALS):
            worst = max(worst, float(np.abs(_logits(model, input_ids) - base).max()))
    finally:
        for h in handles:
            h.remove()
    return worst


def _tolerance(expected, sensitivity):
    """Tolerance for comparing logits with `expected` (see README, "Tolerance")."""
    import numpy as np

    scale = float(np.abs(expected).max())
    return max(1e-5 * scale, 4.0 * float(sensitivity)) + 1e-6


def _versions():
    import platform

    import bitsandbytes
    import numpy
    import safetensors
    import tokenizers
    import torch
    import transformers
    import accelerate

    from bitsandbytes import functional as F

    return {
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "accelerate": accelerate.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "has_avx512bf16": bool(F.has_avx512bf16()),
        "torch_threads": torch.get_num_threads(),
    }


def _build_fp32_model():
    """Fixed-weight small Llama. Weights are scaled so logits are O(1) and int8 outliers exist."""
    import math

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(TORCH_SEED)
    cfg = LlamaConfig(**MODEL_CFG)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
                if "layernorm" in name:  # planted outlier features (the LLM.int8() case)
                    for c in OUTLIER_CHANNELS:
                        p[c] = OUTLIER_GAIN
            elif p.dim() == 2:  # Linear weights [out, in] and lm_head
                # MLP weights smaller, so silu(gate)*up has only a few |x| > 6 columns for down_proj
                scale = MLP_SCALE if ".mlp." in name else 1.0
                p.normal_(0.0, scale / math.sqrt(p.shape[1]))
            else:
                raise AssertionError(f"unexpected parameter {name}")
    return model


def _dequantized_weights(model, mode):
    """name -> fp32 dequantized weight [out_features, in_features] of every quantized Linear."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    out = {}
    for name, m in model.named_modules():
        if mode == "int8" and isinstance(m, bnb.nn.Linear8bitLt):
            CB = m.weight.data
            SCB = m.weight.SCB if getattr(m.weight, "SCB", None) is not None else m.state.SCB
            w = F.int8_vectorwise_dequant(CB, SCB)  # CB * SCB / 127 in fp32
        elif mode == "nf4" and isinstance(m, bnb.nn.Linear4bit):
            w = F.dequantize_4bit(m.weight.data, m.weight.quant_state)
        else:
            continue
        out[name] = w.to(torch.float32).numpy().copy()
    return out


def _outlier_counts(model, input_ids):
    """Number of outlier columns (|x| > threshold) each Linear8bitLt saw on `input_ids`."""
    import bitsandbytes as bnb

    counts = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, bnb.nn.Linear8bitLt):

            def hook(mod, args, out, name=name):
                idx = mod.state.idx
                counts[name] = 0 if idx is None else int(idx.numel())

            hooks.append(m.register_forward_hook(hook))
    _logits(model, input_ids)
    for h in hooks:
        h.remove()
    return counts


def _describe_safetensors(path):
    from safetensors import safe_open

    rows = []
    with safe_open(path, "pt") as f:
        for k in sorted(f.keys()):
            t = f.get_tensor(k)
            rows.append((k, str(t.dtype).replace("torch.", ""), list(t.shape)))
    return rows


def _clean_dir(d):
    """Keep only config.json and model.safetensors (generation_config.json is irrelevant here)."""
    for fn in os.listdir(d):
        if fn not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, fn))


def generate(out_dir):
    import numpy as np
    import torch

    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)
    input_ids = np.random.RandomState(INPUT_SEED).randint(0, MODEL_CFG["vocab_size"], size=INPUT_SHAPE).astype(np.int64)
    arrays = {"input_ids": input_ids}
    meta = {"versions": _versions(), "model_config": MODEL_CFG, "torch_seed": TORCH_SEED, "input_seed": INPUT_SEED,
            "outlier_channels": list(OUTLIER_CHANNELS), "outlier_gain": OUTLIER_GAIN, "mlp_scale": MLP_SCALE,
            "load_kwargs": {"device_map": {"": "cpu"}, "dtype": "float32", "attn_implementation": "eager"},
            "noise_rel": NOISE_REL, "noise_trials": NOISE_TRIALS, "sensitivity": {}, "tolerance": {},
            "outlier_columns": {}, "files": {}}

    fp32_dir = os.path.join(out_dir, "fp32")
    model = _build_fp32_model()
    model.save_pretrained(fp32_dir, safe_serialization=True)
    _clean_dir(fp32_dir)
    # logits of the reloaded fp32 checkpoint (what every other consumer will see)
    fp32 = _load(fp32_dir)
    arrays["logits_fp32"] = _logits(fp32, input_ids)
    assert np.array_equal(arrays["logits_fp32"], _logits(model.float(), input_ids)), "fp32 reload changed logits"
    meta["sensitivity"]["fp32"] = _sensitivity(fp32, input_ids, 1)
    del model, fp32

    for seed, (mode, qcfg) in enumerate(_quant_configs().items(), start=2):
        qdir = os.path.join(out_dir, mode)
        qm = _load(fp32_dir, qcfg)
        arrays[f"logits_{mode}"] = _logits(qm, input_ids)
        meta["sensitivity"][mode] = _sensitivity(qm, input_ids, seed)
        for name, w in _dequantized_weights(qm, mode).items():
            arrays[f"dequant_{mode}__{name}"] = w
        if mode == "int8":
            meta["outlier_columns"] = _outlier_counts(qm, input_ids)
            # same weights, decomposition off: shows that the outlier path changes the result
            for m in qm.modules():
                if hasattr(m, "state") and hasattr(m.state, "threshold"):
                    m.state.threshold = 0.0
            arrays["logits_int8_threshold0"] = _logits(qm, input_ids)
        qm.save_pretrained(qdir, safe_serialization=True)
        _clean_dir(qdir)
        # round trip inside upstream: the saved pre-quantized checkpoint gives the same logits
        again = _logits(_load(qdir), input_ids)
        if not np.array_equal(again, arrays[f"logits_{mode}"]):
            raise AssertionError(f"{mode}: reloaded checkpoint logits differ by {np.abs(again - arrays[f'logits_{mode}']).max()}")
        del qm

    for mode in ("fp32", "int8", "nf4"):
        meta["tolerance"][mode] = _tolerance(arrays[f"logits_{mode}"], meta["sensitivity"][mode])
        path = os.path.join(out_dir, mode, "model.safetensors")
        meta["files"][mode] = {"bytes": os.path.getsize(path), "tensors": _describe_safetensors(path)}
    meta["max_abs_diff"] = {
        "int8_vs_fp32": float(np.abs(arrays["logits_int8"] - arrays["logits_fp32"]).max()),
        "nf4_vs_fp32": float(np.abs(arrays["logits_nf4"] - arrays["logits_fp32"]).max()),
        "int8_vs_int8_threshold0": float(np.abs(arrays["logits_int8"] - arrays["logits_int8_threshold0"]).max()),
    }
    arrays["__meta__"] = np.array(json.dumps(meta, sort_keys=True))
    npz = os.path.join(out_dir, "expected_outputs.npz")
    _write_npz(npz, arrays)

    total = 0
    for root, _, files in os.walk(out_dir):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    print(json.dumps({k: meta[k] for k in ("sensitivity", "tolerance", "max_abs_diff", "outlier_columns")}, indent=1))
    for mode in ("fp32", "int8", "nf4"):
        print(f"{mode}/model.safetensors: {meta['files'][mode]['bytes']} bytes, {len(meta['files'][mode]['tensors'])} tensors")
    print(f"expected_outputs.npz: {os.path.getsize(npz)} bytes; fixture dir total {total} bytes")
    return 0


def _mode_of(ckpt_dir):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        qc = json.load(f).get("quantization_config")
    if not qc:
        return "fp32"
    if qc.get("load_in_8bit"):
        return "int8"
    if qc.get("load_in_4bit"):
        return qc.get("bnb_4bit_quant_type", "fp4")
    raise SystemExit(f"{ckpt_dir}: unrecognised quantization_config {qc}")


def _compare_tensors(ckpt_dir, ref_dir):
    """Compare every tensor of two checkpoints: key sets, dtypes, shapes, exact bytes."""
    import torch
    from safetensors import safe_open

    ok = True
    a = safe_open(os.path.join(ckpt_dir, "model.safetensors"), "pt")
    b = safe_open(os.path.join(ref_dir, "model.safetensors"), "pt")
    ka, kb = set(a.keys()), set(b.keys())
    if ka != kb:
        ok = False
        print(f"  keys only in {ckpt_dir}: {sorted(ka - kb)}")
        print(f"  keys only in {ref_dir}: {sorted(kb - ka)}")
    n_same = n_diff = 0
    for k in sorted(ka & kb):
        ta, tb = a.get_tensor(k), b.get_tensor(k)
        if ta.dtype != tb.dtype or ta.shape != tb.shape:
            ok = False
            n_diff += 1
            print(f"  {k}: {ta.dtype}{list(ta.shape)} vs reference {tb.dtype}{list(tb.shape)}")
        elif "quant_state.bitsandbytes__" in k:
            # packed QuantState JSON: compare parsed content, not bytes (key order / float repr may differ)
            ja, jb = (json.loads(bytes(t.tolist()).decode("utf-8")) for t in (ta, tb))
            if ja == jb:
                n_same += 1
                continue
            n_diff += 1
            diffs = {f: (ja.get(f), jb.get(f)) for f in sorted(set(ja) | set(jb)) if ja.get(f) != jb.get(f)}
            print(f"  {k}: JSON differs (field: (checkpoint, reference)) {diffs}")
            if set(ja) != set(jb) or any(f != "nested_offset" for f in diffs):
                ok = False
        elif ta.numel() and not torch.equal(ta.reshape(-1).view(torch.uint8), tb.reshape(-1).view(torch.uint8)):
            n_diff += 1
            d = (ta.double() - tb.double()).abs().max().item()
            print(f"  {k}: values differ (max abs diff {d:g}; {(ta != tb).sum().item()}/{ta.numel()} elements)")
        else:
            n_same += 1
    print(f"  tensors bit-identical to reference: {n_same}/{len(ka & kb)}  (differing: {n_diff})")
    return ok


def check(ckpt_dir, expect, key=None, atol=None, ref=None):
    import numpy as np
    import torch

    torch.set_num_threads(1)
    if not os.path.isfile(os.path.join(ckpt_dir, "config.json")):
        print(f"FAIL: {ckpt_dir} has no config.json")
        return 1
    mode = _mode_of(ckpt_dir)
    key = key or f"logits_{mode}"
    with np.load(expect, allow_pickle=False) as z:
        if key not in z.files:
            print(f"FAIL: {expect} has no array {key!r} (has {[f for f in z.files if f.startswith('logits')]})")
            return 1
        input_ids, expected = z["input_ids"], z[key]
        meta = json.loads(str(z["__meta__"])) if "__meta__" in z.files else {}
    if atol is None:
        sens_by_mode = meta.get("sensitivity", {})
        sens = sens_by_mode.get(key[len("logits_"):], sens_by_mode.get(mode))
        atol = _tolerance(expected, sens if sens is not None else 0.0)
    print(f"checkpoint: {ckpt_dir} (quantization: {mode}); expected: {expect}[{key}]")
    if ref:
        print(f"tensor comparison with {ref}:")
        if not _compare_tensors(ckpt_dir, ref):
            print("FAIL: checkpoint layout differs from the reference")
            return 1
    model = _load(ckpt_dir)  # pre-quantized: transformers reads quantization_config from config.json
    kinds = sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith("bitsandbytes")})
    print(f"loaded with upstream bitsandbytes modules: {kinds or 'none'}")
    logits = _logits(model, input_ids)
    if logits.shape != expected.shape:
        print(f"FAIL: logits shape {logits.shape} != expected {expected.shape}")
        return 1
    diff = float(np.abs(logits - expected).max())
    top1 = float((logits.argmax(-1) == expected.argmax(-1)).mean())
    ok = bool(np.isfinite(logits).all()) and diff <= atol
    print(f"max abs diff {diff:.3g} (tolerance {atol:.3g}, max |expected| {float(np.abs(expected).max()):.3g}); top-1 agreement {top1:.3f}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def inner_main(args) -> int:
    if args.check:
        if not args.expect:
            raise SystemExit("--check needs --expect NPZ")
        return check(args.check, args.expect, key=args.key, atol=args.atol, ref=args.ref)
    return generate(args.out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture directory to write (generate mode)")
    ap.add_argument("--check", metavar="DIR", help="checkpoint directory to load in upstream and verify")
    ap.add_argument("--expect", metavar="NPZ", help="npz with input_ids and logits_<mode> (check mode)")
    ap.add_argument("--key", help="array of --expect to compare with (default logits_<mode of DIR>)")
    ap.add_argument("--atol", type=float, help="override the max-abs-diff tolerance")
    ap.add_argument("--ref", metavar="DIR2", help="also compare DIR's tensors with this checkpoint's (check mode)")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("out", "check", "expect", "ref"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    if args.inside:
        return inner_main(args)
    # pass absolute paths through to the inner run
    fwd = ["--out", args.out]
    for name in ("check", "expect", "ref", "key"):
        if getattr(args, name):
            fwd += [f"--{name}", getattr(args, name)]
    if args.atol is not None:
        fwd += ["--atol", repr(args.atol)]
    return outer_main(fwd)


if __name__ == "__main__":
    sys.exit(main())
