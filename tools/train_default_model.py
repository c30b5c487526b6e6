#!/usr/bin/env python3
"""Train the small default Llama model that ships in ``bitsandbytes_ms/default_model``.

The bitsandbytes_ms quantize-and-generate demo must work without downloading
anything from a model hub, so the repository embeds a tiny Llama-architecture
causal LM with *trained* weights.  This script regenerates it, deterministically
(fixed seeds, fixed data order, fixed thread count), from English text that
ships with every CPython installation:

* ``pydoc_data.topics.topics`` -- the language-reference help topics, and
* the docstrings (``inspect.getdoc``) of a fixed, sorted list of stdlib modules
  and of the classes, functions and methods they define.

A deterministic ~7% of the documents (chosen by CRC32 of the document name) is
held out for evaluation and written to ``heldout.txt``.

Training uses real PyTorch on the CPU (much faster than MindSpore NLP there).
The script creates (or reuses) a throwaway virtual environment at
``~/.cache/bitsandbytes_ms/train-env`` with pinned packages and re-executes
itself inside it; the project environment is never touched.

Usage::

    python tools/train_default_model.py                # full run (~12 min, 2 cores)
    python tools/train_default_model.py --steps 20 --out /tmp/m   # smoke test

Output: config.json, generation_config.json, model.safetensors (fp32),
tokenizer.json, tokenizer_config.json, special_tokens_map.json, heldout.txt
and README.md in ``--out`` (default ``bitsandbytes_ms/default_model``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
import zlib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "bitsandbytes_ms", "default_model")
VENV_DIR = os.path.join(os.path.expanduser("~"), ".cache", "bitsandbytes_ms", "train-env")
# torch 2.13.0 is a local CPU wheel: any other version would download GBs.
VENV_REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==4.57.1",
    "tokenizers==0.22.2",
    "safetensors==0.7.0",
    "numpy<2",
]
_REEXEC_FLAG = "BNB_MS_TRAIN_ENV_ACTIVE"

SEED = 1234
HELDOUT_PERCENT = 7          # documents with crc32(name) % 100 < this are held out
HELDOUT_TXT_LIMIT = 200_000  # bytes of held-out text written to heldout.txt

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3

# Fixed, sorted list of stdlib modules whose docstrings form most of the corpus.
# Modules with import-time side effects (this, antigravity, idlelib, turtle...)
# are deliberately absent; any module that fails to import or prints while
# importing is skipped at run time.
STDLIB_MODULES = sorted([
    "abc", "argparse", "array", "ast", "asyncio", "asyncio.events", "asyncio.futures",
    "asyncio.locks", "asyncio.queues", "asyncio.streams", "asyncio.tasks", "base64",
    "bdb", "binascii", "bisect", "builtins", "bz2", "calendar", "cmath", "cmd", "code",
    "codecs", "codeop", "collections", "collections.abc", "colorsys", "compileall",
    "concurrent.futures", "configparser", "contextlib", "contextvars", "copy",
    "copyreg", "csv", "ctypes", "dataclasses", "datetime", "dbm", "decimal", "difflib",
    "dis", "doctest", "email", "email.charset", "email.header", "email.message",
    "email.mime.text", "email.parser", "email.policy", "email.utils", "encodings",
    "enum", "errno", "faulthandler", "filecmp", "fileinput", "fnmatch", "fractions",
    "ftplib", "functools", "gc", "getopt", "getpass", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http", "http.client",
    "http.cookiejar", "http.cookies", "http.server", "imaplib", "importlib",
    "importlib.abc", "importlib.machinery", "importlib.metadata", "importlib.resources",
    "importlib.util", "inspect", "io", "ipaddress", "itertools", "json", "json.decoder",
    "json.encoder", "keyword", "linecache", "locale", "logging", "logging.config",
    "logging.handlers", "lzma", "mailbox", "marshal", "math", "mimetypes", "mmap",
    "modulefinder", "multiprocessing", "multiprocessing.pool", "netrc", "numbers",
    "operator", "optparse", "os", "os.path", "pathlib", "pdb", "pickle",
    "pickletools", "pkgutil", "platform", "plistlib", "poplib", "pprint", "profile",
    "pstats", "py_compile", "pyclbr", "pydoc", "queue", "quopri", "random", "re",
    "reprlib", "rlcompleter", "runpy", "sched", "secrets", "select", "selectors",
    "shelve", "shlex", "shutil", "signal", "site", "smtplib", "socket", "socketserver",
    "sqlite3", "ssl", "stat", "statistics", "string", "stringprep", "struct",
    "subprocess", "symtable", "sys", "sysconfig", "tabnanny", "tarfile", "tempfile",
    "textwrap", "threading", "time", "timeit", "token", "tokenize", "trace",
    "traceback", "tracemalloc", "types", "typing", "unicodedata", "unittest",
    "unittest.mock", "urllib.error", "urllib.parse", "urllib.request",
    "urllib.robotparser", "uuid", "warnings", "wave", "weakref", "webbrowser",
    "wsgiref.simple_server", "wsgiref.util", "xml.dom.minidom", "xml.etree.ElementTree",
    "xml.sax", "xml.sax.saxutils", "xmlrpc.client", "xmlrpc.server", "zipapp",
    "zipfile", "zipimport", "zlib", "zoneinfo",
])

# Model / training hyper-parameters (sized for ~12 minutes on 2 CPU cores).
MODEL_CONFIG = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    hidden_act="silu",
    initializer_range=0.02,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
)
SEQ_LEN = 256
BATCH_SIZE = 16
DEFAULT_STEPS = 300
PEAK_LR = 2e-3
MIN_LR_RATIO = 0.1
WARMUP_STEPS = 30
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
EVAL_EVERY = 50
EVAL_BATCHES = 4  # x BATCH_SIZE windows of SEQ_LEN tokens


# --------------------------------------------------------------------------- #
# Throwaway venv handling
# --------------------------------------------------------------------------- #
def _venv_python() -> str:
    return os.path.join(VENV_DIR, "bin", "python")


def ensure_venv_and_reexec() -> None:
    """Re-execute this script inside the pinned training venv (creating it)."""
    if os.environ.get(_REEXEC_FLAG) == "1":
        return
    py = _venv_python()
    marker = os.path.join(VENV_DIR, ".requirements")
    wanted = "\n".join(VENV_REQUIREMENTS)
    if not (os.path.exists(py) and os.path.exists(marker)
            and open(marker).read() == wanted):
        print(f"[setup] creating training venv at {VENV_DIR}", flush=True)
        os.makedirs(os.path.dirname(VENV_DIR), exist_ok=True)
        subprocess.check_call([sys.executable, "-m", "venv", VENV_DIR])
        subprocess.check_call([py, "-m", "pip", "install", "--quiet", *VENV_REQUIREMENTS])
        with open(marker, "w") as f:
            f.write(wanted)
    env = dict(os.environ)
    env[_REEXEC_FLAG] = "1"
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.execve(py, [py, os.path.abspath(__file__), *sys.argv[1:]], env)


# --------------------------------------------------------------------------- #
# Corpus
# --------------------------------------------------------------------------- #
def _clean(text: str) -> str:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    out, blank = [], 0
    for ln in lines:
        blank = blank + 1 if not ln else 0
        if blank <= 1:
            out.append(ln)
    return "\n".join(out).strip()


def _import_quietly(name: str):
    import importlib
    import warnings
    buf_out, buf_err = io.StringIO(), io.StringIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
                mod = importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - any failure means "skip"
        return None
    if buf_out.getvalue() or buf_err.getvalue():
        return None
    return mod


def _module_document(name: str, mod, seen: set) -> str:
    import inspect

    def doc_of(obj):
        try:
            d = inspect.getdoc(obj)
        except Exception:  # noqa: BLE001
            return None
        if not d or len(d) < 20:
            return None
        d = _clean(d)
        if d in seen:
            return None
        seen.add(d)
        return d

    parts = []
    d = doc_of(mod)
    if d:
        parts.append(f"Module {name}\n\n{d}")
    try:
        members = sorted(vars(mod).items())
    except Exception:  # noqa: BLE001
        members = []
    for attr, obj in members:
        if attr.startswith("_"):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) != mod.__name__ and name != "builtins":
            continue
        d = doc_of(obj)
        kind = "class" if inspect.isclass(obj) else "function"
        if d:
            parts.append(f"{kind} {name}.{attr}\n\n{d}")
        if inspect.isclass(obj):
            for mname, meth in sorted(vars(obj).items()):
                if mname.startswith("_") and mname != "__init__":
                    continue
                if not (inspect.isroutine(meth) or isinstance(meth, property)):
                    continue
                md = doc_of(meth)
                if md:
                    parts.append(f"method {name}.{attr}.{mname}\n\n{md}")
    return "\n\n".join(parts)


def build_corpus():
    """Return a sorted list of (doc_name, text) documents."""
    from pydoc_data.topics import topics

    docs = []
    for key in sorted(topics):
        text = _clean(topics[key])
        if text:
            docs.append((f"topic:{key}", text))
    seen: set = set()
    skipped = []
    for name in STDLIB_MODULES:
        mod = _import_quietly(name)
        if mod is None:
            skipped.append(name)
            continue
        text = _module_document(name, mod, seen)
        if len(text) >= 200:
            docs.append((f"module:{name}", text))
    if skipped:
        print(f"[data] skipped modules: {', '.join(skipped)}", flush=True)
    return docs


def is_heldout(doc_name: str) -> bool:
    return zlib.crc32(doc_name.encode("utf-8")) % 100 < HELDOUT_PERCENT


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #
def train_tokenizer(train_texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=SEQ_LEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    assert fast.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3], "special token ids"
    return fast


def encode_stream(tokenizer, texts):
    """bos + doc + eos for each document, concatenated."""
    import numpy as np
    ids = []
    eos = tokenizer.eos_token_id
    for enc in tokenizer(list(texts), add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
def evaluate(model, windows, batch_size):
    """Mean next-token loss over fixed (n, SEQ_LEN+1) windows."""
    import torch
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch_size):
            x = windows[i:i + batch_size]
            logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += x[:, 1:].numel()
    model.train()
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="optimizer steps")
    ap.add_argument("--no-venv", action="store_true",
                    help="run in the current interpreter (needs torch/transformers)")
    args = ap.parse_args()
    if not args.no_venv:
        ensure_venv_and_reexec()

    import random

    import numpy as np
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    t_start = time.time()
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()

    # ---- data -------------------------------------------------------------
    docs = build_corpus()
    train_docs = [(n, t) for n, t in docs if not is_heldout(n)]
    held_docs = [(n, t) for n, t in docs if is_heldout(n)]
    train_chars = sum(len(t) for _, t in train_docs)
    held_chars = sum(len(t) for _, t in held_docs)
    print(f"[data] {len(docs)} documents: {len(train_docs)} train ({train_chars:,} chars), "
          f"{len(held_docs)} held out ({held_chars:,} chars)", flush=True)
    print(f"[data] held out: {', '.join(n for n, _ in held_docs)}", flush=True)

    tokenizer = train_tokenizer([t for _, t in train_docs], MODEL_CONFIG["vocab_size"])
    train_ids = encode_stream(tokenizer, [t for _, t in train_docs])
    held_ids = encode_stream(tokenizer, [t for _, t in held_docs])
    print(f"[data] tokens: train {len(train_ids):,}, held out {len(held_ids):,} "
          f"({train_chars / len(train_ids):.2f} chars/token)", flush=True)

    def fixed_windows(ids, n):
        starts = np.arange(0, len(ids) - SEQ_LEN - 1, SEQ_LEN)[:n]
        return torch.from_numpy(np.stack([ids[s:s + SEQ_LEN + 1] for s in starts]))

    n_eval = EVAL_BATCHES * BATCH_SIZE
    held_windows = fixed_windows(held_ids, n_eval)
    eval_rng = np.random.default_rng(SEED + 1)
    tr_starts = eval_rng.integers(0, len(train_ids) - SEQ_LEN - 1, size=n_eval)
    train_eval_windows = torch.from_numpy(
        np.stack([train_ids[s:s + SEQ_LEN + 1] for s in sorted(tr_starts)]))

    # ---- model ------------------------------------------------------------
    config = LlamaConfig(**MODEL_CONFIG)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[model] LlamaForCausalLM {n_params:,} parameters", flush=True)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < WARMUP_STEPS:
            return PEAK_LR * (step + 1) / WARMUP_STEPS
        progress = (step - WARMUP_STEPS) / max(1, args.steps - WARMUP_STEPS)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return PEAK_LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * cos)

    batch_rng = np.random.default_rng(SEED)
    model.train()
    t_train = time.time()
    cpu_train = time.process_time()
    running, history = None, []
    for step in range(args.steps):
        starts = batch_rng.integers(0, len(train_ids) - SEQ_LEN - 1, size=BATCH_SIZE)
        x = torch.from_numpy(np.stack([train_ids[s:s + SEQ_LEN + 1] for s in starts]))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % 10 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            print(f"[train] step {step:4d}/{args.steps} loss {loss.item():.4f} "
                  f"(avg {running:.4f}) lr {lr_at(step):.2e} gnorm {gnorm:.2f} "
                  f"{el:6.0f}s", flush=True)
        if (step + 1) % EVAL_EVERY == 0 or step == args.steps - 1:
            hl = evaluate(model, held_windows, BATCH_SIZE)
            history.append((step + 1, running, hl))
            print(f"[eval] step {step + 1}: held-out loss {hl:.4f} ppl {math.exp(hl):.2f}",
                  flush=True)
    train_secs = time.time() - t_train
    train_cpu_secs = time.process_time() - cpu_train

    final_train = evaluate(model, train_eval_windows, BATCH_SIZE)
    final_held = evaluate(model, held_windows, BATCH_SIZE)
    print(f"[final] train loss {final_train:.4f} ppl {math.exp(final_train):.2f} | "
          f"held-out loss {final_held:.4f} ppl {math.exp(final_held):.2f} | "
          f"training {train_secs:.0f}s", flush=True)

    # ---- sample -----------------------------------------------------------
    model.eval()
    prompt = "The list type"
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=30, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    sample = tokenizer.decode(out[0], skip_special_tokens=True)
    print(f"[sample] {sample!r}", flush=True)

    # ---- save -------------------------------------------------------------
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = model.to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)

    held_text = "\n\n".join(t for _, t in held_docs)
    held_bytes = held_text.encode("utf-8")[:HELDOUT_TXT_LIMIT]
    held_text = held_bytes.decode("utf-8", errors="ignore")
    held_text = held_text[:held_text.rfind("\n") + 1] if "\n" in held_text else held_text
    with open(os.path.join(out_dir, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held_text)

    # Perplexity on the first 512 tokens of heldout.txt (what a port can check
    # against: one window, no bos, plain next-token loss).
    ids = tokenizer(held_text[:8000], add_special_tokens=False, return_tensors="pt").input_ids
    ids = ids[:, :SEQ_LEN]
    with torch.no_grad():
        ref_loss = model(input_ids=ids, labels=ids).loss.item()

    stats = {
        "parameters": n_params,
        "train_documents": len(train_docs),
        "heldout_documents": len(held_docs),
        "train_chars": train_chars,
        "heldout_chars": held_chars,
        "train_tokens": int(len(train_ids)),
        "heldout_tokens": int(len(held_ids)),
        "steps": args.steps,
        "tokens_seen": args.steps * BATCH_SIZE * SEQ_LEN,
        "training_seconds": round(train_secs, 1),
        "training_cpu_seconds": round(train_cpu_secs, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "final_train_loss": round(final_train, 4),
        "final_heldout_loss": round(final_held, 4),
        "heldout_txt_first256_loss": round(ref_loss, 4),
        "history": history,
        "sample": sample,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    write_readme(out_dir, stats)
    files = sorted(os.listdir(out_dir))
    total = 0
    for fn in files:
        sz = os.path.getsize(os.path.join(out_dir, fn))
        total += sz
        print(f"[save] {fn:28s} {sz:>12,} bytes", flush=True)
    print(f"[save] total {total:,} bytes in {out_dir}", flush=True)
    print("[stats] " + json.dumps({k: v for k, v in stats.items() if k != "history"}), flush=True)


def write_readme(out_dir, s):
    c = MODEL_CONFIG
    hist = "\n".join(
        f"| {st} | {tr:.3f} | {hl:.3f} | {math.exp(hl):.1f} |" for st, tr, hl in s["history"])
    text = f"""# bitsandbytes_ms default model

A tiny Llama-architecture causal language model with **trained** weights that
ships inside the repository, so the quantize-and-generate demo and the tests
run without downloading anything from a model hub.  It is data, not a Python
package.  Load it with MindSpore NLP (or plain transformers) from this folder:

```python
import mindspore
import mindnlp  # before anything imports torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(path)
tokenizer = AutoTokenizer.from_pretrained(path)
```

It is small and was trained for minutes on a CPU: its text is English-like
Python-documentation prose, not reliable facts.

## Model

| | |
|---|---|
| architecture | `LlamaForCausalLM` (transformers {s['transformers']}) |
| parameters | {s['parameters']:,} (fp32 `model.safetensors`) |
| vocab | {c['vocab_size']} (byte-level BPE; `<unk>`=0, `<s>`=1, `<pad>`=3, `</s>`=2) |
| hidden / intermediate | {c['hidden_size']} / {c['intermediate_size']} |
| layers / heads / kv heads | {c['num_hidden_layers']} / {c['num_attention_heads']} / {c['num_key_value_heads']} |
| context | {c['max_position_embeddings']} tokens (RoPE, theta {c['rope_theta']:g}) |
| embeddings | untied (`tie_word_embeddings=False`) |

The tokenizer adds `<s>` in front of every encoded text (as Llama's does) and
pads on the left.

## Data

English text that ships with CPython 3.11: `pydoc_data.topics.topics` (the
language-reference help topics) and the docstrings (`inspect.getdoc`) of a
fixed, sorted list of stdlib modules and the classes, functions and methods
they define (see `STDLIB_MODULES` in `tools/train_default_model.py`).  One
document per topic or module; documents whose CRC32 of the name is below
{HELDOUT_PERCENT} (mod 100) are held out:

* train: {s['train_documents']} documents, {s['train_chars']:,} characters, {s['train_tokens']:,} tokens
* held out: {s['heldout_documents']} documents, {s['heldout_chars']:,} characters, {s['heldout_tokens']:,} tokens

`heldout.txt` holds the held-out text (the first {HELDOUT_TXT_LIMIT // 1000} KB), for
perplexity checks of the quantized model.

## Training

PyTorch {s['torch']} on 2 CPU threads, fixed seed {SEED}: {s['steps']} AdamW steps
(betas 0.9/0.95, weight decay {WEIGHT_DECAY}), batch {BATCH_SIZE} x {SEQ_LEN} tokens
({s['tokens_seen']:,} tokens seen), peak learning rate {PEAK_LR:g} with
{WARMUP_STEPS} warm-up steps and cosine decay to {MIN_LR_RATIO:g}x, gradient
clipping at {GRAD_CLIP}.  Training took {s['training_seconds'] / 60:.1f} minutes of wall
clock ({s['training_cpu_seconds'] / 60:.1f} CPU-minutes; {s['total_seconds'] / 60:.1f} minutes with
data and tokenizer).  Wall time depends on what else runs on the 2 cores: with
both free a step takes about 1.5 s, i.e. about 8 minutes in all.

| step | train loss (running) | held-out loss | held-out ppl |
|---|---|---|---|
{hist}

Final (over {EVAL_BATCHES * BATCH_SIZE} windows of {SEQ_LEN} tokens each):

* train loss **{s['final_train_loss']:.4f}** (perplexity {math.exp(s['final_train_loss']):.2f})
* held-out loss **{s['final_heldout_loss']:.4f}** (perplexity {math.exp(s['final_heldout_loss']):.2f})
* first {SEQ_LEN} tokens of `heldout.txt` (no `<s>`): loss {s['heldout_txt_first256_loss']:.4f}
  (perplexity {math.exp(s['heldout_txt_first256_loss']):.2f}) -- a reference for ports

Greedy sample (`max_new_tokens=30`, prompt "The list type"):

> {s['sample']!r}

## Regenerate

```sh
python tools/train_default_model.py            # writes bitsandbytes_ms/default_model/
```

The script creates a throwaway venv at `~/.cache/bitsandbytes_ms/train-env`
(`{' '.join(VENV_REQUIREMENTS)}`) and re-runs itself there.
"""
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
