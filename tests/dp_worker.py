"""One worker of the data-parallel tests (tests/test_distributed.py): a LoRA adapter (peft) on a 4-bit
base (bitsandbytes_ms Linear4bit) trained with our optimizers, data-parallel over mindtorch's
``torch.distributed`` (bridged to MindSpore's collectives by bitsandbytes_ms.register()).

Run under msrun (tools/launch_dp.sh) it trains on its shard of each global batch and all-reduces the
gradients (mean); run as one plain process (no msrun) it trains on the whole global batch. Either way it
writes ``<out>/rank<r>.npz``: per step the loss of the global batch and the bytes of every trainable
parameter and every optimizer-state tensor. The test compares the files.

    python tests/dp_worker.py --out DIR [--model tiny|smollm2] [--steps N] [--batch B] [--seq T]

What it covers on the way (each a hard failure of the worker, exit 1):
  * parameters broadcast from rank 0: every rank starts from different LoRA values (mindtorch's CPU
    ``randn`` ignores seeds, and each rank overwrites them with its own numbers), and after the broadcast
    every rank holds rank 0's values;
  * three optimizers over disjoint parameters: AdamW8bit (one parameter overridden to 32-bit state by
    GlobalOptimManager), PagedAdamW8bit, PagedAdamW (32-bit);
  * state_dict: halfway, rank 0 saves every optimizer's state_dict with torch.save; all ranks load it
    into fresh optimizers and go on (the loaded state must equal the state each rank had);
  * the bridge's errors for bad input (a second init, an unsupported op, a bad src or group);
  * the mindspore.nn user too: a Cell model of our Cell layers (Linear4bitCell base + LoRAAdapter,
    Linear8bitLtCell; frozen quantized weights, trainable adapter and biases) trained with AdamW8bit,
    gradients averaged by MindSpore's nn.DistributedGradReducer (``cell/...`` in the file).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import mindspore

mindspore.set_device("CPU")
mindspore.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401  (torch is mindtorch from here on)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms.integrations import quant_4bit  # noqa: E402

VOCAB_TINY = 64


class Tiny(torch.nn.Module):
    """Embedding, two gated projections (the LoRA targets), head; every Linear becomes a Linear4bit."""

    def __init__(self, d=64):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB_TINY, d)
        self.q_proj = torch.nn.Linear(d, d)
        self.v_proj = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, VOCAB_TINY)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        h = h + torch.nn.functional.silu(self.q_proj(h)) * self.v_proj(h)
        return self.head(h)


def _set(p, value):
    p.assign_value(mindspore.Tensor(np.ascontiguousarray(value, dtype=np.float32)))


def build_tiny():
    model = Tiny()
    rng = np.random.RandomState(0)  # the frozen base: the same fixed numbers on every rank
    for _, p in model.named_parameters():
        _set(p, rng.randn(*p.shape) * 0.1)
    quant_4bit(model, quant_type="nf4", compute_dtype="fp32")
    # 64 sequences of 17 tokens from interleaved arithmetic patterns (learnable, unlike random tokens)
    seqs = np.stack([(np.arange(17) * (1 + 2 * (r % 7)) + 5 * r) % VOCAB_TINY for r in range(64)]).astype(np.int64)
    return model, seqs, VOCAB_TINY, ["q_proj", "v_proj"]


def smollm2_dir():
    root = Path(os.environ.get("BNB_MS_CACHE_DIR") or Path.home() / ".cache" / "bitsandbytes_ms" / "models")
    found = sorted(d for d in (root / "gguf").glob("SmolLM2-135M-Instruct*") if (d / "config.json").exists())
    return found[-1] if found else None


def build_smollm2(seq):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir()
    if path is None:
        raise SystemExit("dp_worker: SmolLM2-135M not converted (run tools/bench_model.py once)")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    quant_4bit(model, quant_type="nf4", compute_dtype="fp32")
    tok = AutoTokenizer.from_pretrained(str(path))
    text = (Path(bnb.__file__).parent / "default_model" / "heldout.txt").read_text()
    ids = np.array(tok(text)["input_ids"], np.int64)
    n = len(ids) // (seq + 1)
    return model, ids[: n * (seq + 1)].reshape(n, seq + 1), model.config.vocab_size, ["q_proj", "v_proj"]


def fail(msg):
    print(f"dp_worker: FAIL: {msg}", flush=True)
    sys.exit(1)


def opt_tensors(opts):
    """{name: numpy} of every tensor in the optimizers' states, by parameter index."""
    out = {}
    for k, opt in enumerate(opts):
        for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
            for key, v in sorted(opt.state[p].items()):
                if isinstance(v, mindspore.Tensor):
                    out[f"opt{k}/p{i}/{key}"] = v.asnumpy().copy()
                else:
                    out[f"opt{k}/p{i}/{key}"] = np.array(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences per step, all ranks)")
    ap.add_argument("--seq", type=int, default=64, help="sequence length (smollm2)")
    ap.add_argument("--lr", type=float, default=2e-2, help="learning rate of the LoRA optimizers")
    ap.add_argument("--reference", action="store_true",
                    help="rank 0 then also trains one process on the whole global batch (reference.npz)")
    a = ap.parse_args()
    t0 = time.time()
    bnb.register()
    distributed = "MS_ROLE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if a.batch % world:
        fail(f"--batch {a.batch} is not a multiple of the world size {world}")
    print(f"dp_worker: rank {rank}/{world}: started in {time.time() - t0:.1f}s", flush=True)
    if distributed:
        check_bad_input(world)
    train(a, build(a), distributed, rank, world, f"rank{rank}")
    if a.reference:
        # built on every rank: mindnlp's from_pretrained holds a torch.distributed barrier once it is initialised
        built = build(a)
        if rank == 0:
            train(a, built, False, 0, 1, "reference")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def check_bad_input(world):
    """The bridge's own errors, raised before any communication (every rank raises the same ones)."""
    t = torch.tensor([1.0, 2.0])
    cases = [(lambda: dist.init_process_group("gloo"), RuntimeError, "twice"),
             (lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), ValueError, "op must be"),
             (lambda: dist.all_reduce([1.0]), TypeError, "tensor must be a Tensor"),
             (lambda: dist.broadcast(t, src=world), ValueError, "src must be a rank"),
             (lambda: dist.broadcast(t), ValueError, "exactly one of src and group_src"),
             (lambda: dist.get_rank(group="another"), ValueError, "group must be None")]
    for call, exc, text in cases:
        try:
            call()
        except exc as e:
            if text not in str(e):
                fail(f"bad input raised {type(e).__name__}({e}) without {text!r}")
        else:
            fail(f"bad input did not raise {exc.__name__} ({text!r})")


def build(a):
    return build_tiny() if a.model == "tiny" else build_smollm2(a.seq)


def train(a, built, distributed, rank, world, name):
    """Trains ``built`` (model, sequences, vocabulary size, LoRA targets) from rank 0's starting values;
    writes <out>/<name>.npz."""
    model, seqs, vocab, targets = built
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0))
    if a.model == "tiny":  # the embedding trains too (a "modules_to_save"-like full-precision parameter)
        model.base_model.model.emb.weight.requires_grad = True
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # grouped as the optimizers take them: q_proj's LoRA, v_proj's, the rest
    named = sorted(named, key=lambda np_: 0 if "q_proj" in np_[0] else 1 if "v_proj" in np_[0] else 2)
    params = [p for _, p in named]

    # rank 0's starting values; every other rank starts elsewhere, so the broadcast has work to do
    # (lora_B starts at zero as peft's own init: the adapted model starts as the base model)
    init = {n: np.zeros(p.shape) if "lora_B" in n else np.random.RandomState(100 + i).randn(*p.shape) * 0.05
            for i, (n, p) in enumerate(named)}
    for i, (n, p) in enumerate(named):
        _set(p, init[n] if rank == 0 else np.random.RandomState(1000 + 17 * rank + i).randn(*p.shape))
    if distributed:
        for p in params:
            dist.broadcast(p, src=0)
        for n, p in named:
            if not np.array_equal(p.asnumpy(), init[n].astype(np.float32)):
                fail(f"rank {rank}: {n} differs from rank 0 after the broadcast")

    q = [p for n, p in named if "q_proj" in n]
    v = [p for n, p in named if "v_proj" in n]
    rest = [p for n, p in named if "q_proj" not in n and "v_proj" not in n]
    mng = bnb.optim.GlobalOptimManager.get_instance()
    mng.register_parameters(params)
    override = next(p for n, p in named if "q_proj" in n and "lora_B" in n)
    mng.override_config(override, "optim_bits", 32)

    def make_opts():
        opts = [bnb.optim.AdamW8bit(q, lr=a.lr, weight_decay=0.01, min_8bit_size=256),
                bnb.optim.PagedAdamW8bit(v, lr=a.lr, min_8bit_size=256)]
        if rest:
            opts.append(bnb.optim.PagedAdamW(rest, lr=1e-2))
        return opts

    opts = make_opts()

    def loss_fn(ids, labels):
        logits = model(input_ids=ids)
        logits = logits.logits if hasattr(logits, "logits") else logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    value_and_grad = torch.autograd.value_and_grad(loss_fn, params, attach_grads=False)
    per_rank = a.batch // world
    record, losses = {}, []
    t_train = time.time()
    for step in range(a.steps):
        start = (step * a.batch) % (len(seqs) - a.batch + 1)
        mine = seqs[start + rank * per_rank: start + (rank + 1) * per_rank]
        loss, grads = value_and_grad(torch.tensor(mine[:, :-1]), torch.tensor(mine[:, 1:]))
        grads = list(grads)
        if distributed:
            for g in grads:
                dist.all_reduce(g, op=dist.ReduceOp.AVG)
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        k = 0
        for opt in opts:
            n = sum(len(g["params"]) for g in opt.param_groups)
            opt.step(grads=grads[k:k + n])
            k += n
        losses.append(float(loss.asnumpy()))
        if os.environ.get("DP_WORKER_VERBOSE"):
            print(f"dp_worker: {name} step {step} loss {losses[-1]:.5f} at {time.time() - t_train:.1f}s", flush=True)
        if step == a.steps // 2:  # rank 0 saves the optimizers; every rank reloads them into new ones
            before = opt_tensors(opts)
            ckpt = Path(a.out) / f"opt_state_world{world}.pt"  # rank 0 writes it, every rank reads it
            if rank == 0:
                torch.save([opt.state_dict() for opt in opts], str(ckpt))
            if distributed:
                dist.barrier()
            opts = make_opts()
            for opt, sd in zip(opts, torch.load(str(ckpt))):
                opt.load_state_dict(sd)
            after = opt_tensors(opts)
            if sorted(before) != sorted(after):
                fail(f"rank {rank}: loaded optimizer state has other tensors: {sorted(set(before) ^ set(after))}")
            for key in before:
                if before[key].tobytes() != after[key].tobytes() or before[key].dtype != after[key].dtype:
                    fail(f"rank {rank}: loaded optimizer state {key} differs from the saved one")
            if distributed:
                dist.barrier()
        for n, p in named:
            record[f"step{step}/param/{n}"] = p.asnumpy().copy()
        for key, val in opt_tensors(opts).items():
            record[f"step{step}/state/{key}"] = val
    record["losses"] = np.array(losses, np.float64)
    record.update(train_cell(a, distributed, rank, world))
    dtypes = {key: str(v.dtype) for key, v in opt_tensors(opts).items()}
    record["state_dtypes"] = np.array(sorted(f"{k}={v}" for k, v in dtypes.items()))
    np.savez(Path(a.out) / f"{name}.npz", **record)
    print(f"dp_worker: {name} ({rank}/{world}) ok: {a.steps} steps {time.time() - t_train:.1f}s, "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def train_cell(a, distributed, rank, world, steps=4):
    """The mindspore.nn user: a Cell model of our Cell layers -- a frozen NF4 base (Linear4bitCell, double quant)
    with a trainable LoRA adapter and bias, then a frozen int8 Linear8bitLtCell with a trainable bias -- trained
    with AdamW8bit, gradients averaged by MindSpore's own nn.DistributedGradReducer (no torch.distributed).
    Returns {"cell/...": numpy}."""
    from mindspore import nn, ops

    from bitsandbytes_ms.nn import Linear4bitCell, Linear8bitLtCell, LoRAAdapter

    rng = np.random.RandomState(7)  # the frozen base: the same fixed numbers on every rank

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.l1 = LoRAAdapter(Linear4bitCell(64, 64, quant_type="nf4", compress_statistics=True,
                                                 weight=mindspore.Tensor((rng.randn(64, 64) * 0.1).astype(np.float32))),
                                  r=8, seed=3)
            self.l2 = Linear8bitLtCell(64, 32, weight=mindspore.Tensor((rng.randn(32, 64) * 0.1).astype(np.float32)))

        def construct(self, x, y):  # MindSpore's functional ops (see bitsandbytes_ms.nn.cells)
            return ops.mean(ops.square(ops.sub(self.l2(ops.tanh(self.l1(x))), y)))

    net = Net()
    net.l1.lora_up.set_data(mindspore.Tensor((rng.randn(64, 8) * 0.05).astype(np.float32)))
    # the adapter first: p0 (lora_down, 512 values) gets 8-bit AdamW state, the biases 32-bit (min_8bit_size)
    params = [net.l1.lora_down, net.l1.lora_up, net.l1.base.bias, net.l2.bias]
    assert sorted(p.name for p in params) == sorted(p.name for p in net.trainable_params())
    frozen = {p.name: p.asnumpy().copy() for p in net.get_parameters() if not p.requires_grad}
    opt = bnb.optim.AdamW8bit(params, lr=1e-2, min_8bit_size=256)
    reducer = nn.DistributedGradReducer(params, mean=True, degree=world) if distributed else None
    x_all = np.random.RandomState(8).randn(a.batch, 64).astype(np.float32)
    y_all = np.random.RandomState(9).randn(a.batch, 32).astype(np.float32)
    per_rank = a.batch // world
    x = mindspore.Tensor(x_all[rank * per_rank:(rank + 1) * per_rank])
    y = mindspore.Tensor(y_all[rank * per_rank:(rank + 1) * per_rank])
    value_and_grad = mindspore.value_and_grad(net, None, weights=params)
    out, losses = {}, []
    for step in range(steps):
        loss, grads = value_and_grad(x, y)
        if reducer is not None:
            grads = reducer(grads)
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        opt.step(grads=list(grads))
        losses.append(float(loss.asnumpy()))
        for i, p in enumerate(params):
            out[f"cell/step{step}/param/{i}"] = p.asnumpy().copy()
        for key, val in opt_tensors([opt]).items():
            out[f"cell/step{step}/state/{key}"] = val
    for p in net.get_parameters():
        if p.name in frozen and not np.array_equal(p.asnumpy(), frozen[p.name]):
            fail(f"the frozen quantized parameter {p.name} changed in training")
    out["cell/losses"] = np.array(losses, np.float64)
    return out


if __name__ == "__main__":
    main()
