"""Port of upstream bitsandbytes tests/test_modules.py (MIT license, bitsandbytes-foundation): the 4-bit and
embedding tests.

Only what the port forces is changed; each change is marked `# PORT:`. `torch` is MindSpore NLP's
mindtorch (compat_tests/conftest.py imports mindnlp first).
PORT: not here: test_linear8bitlt_inference, test_linear8bitlt_no_fp16_weights and the Int8Lt cases (ported
with LLM.int8() by its owner); test_linear_kbit_fp32_bias and test_kbit_backprop (they parametrize over
Linear8bitLt and rely on `loss.backward()`, a no-op in mindtorch; the 4-bit gradients are checked in
compat_tests/test_autograd_4bit.py and tests/test_fourbit.py).
"""

import contextlib
import inspect
import logging

import pytest
import torch
from torch import nn

import bitsandbytes_ms as bnb  # PORT: was `import bitsandbytes as bnb`
import bitsandbytes_ms.nn  # noqa: F401  PORT: make `bnb.nn` resolve
from helpers import get_available_devices, id_formatter  # noqa: F401  PORT: was tests.helpers


def is_supported_on_hpu(*args):  # PORT: only consulted when device == "hpu", which MindSpore does not have
    return False


@contextlib.contextmanager
def caplog_at_level(caplog, level, logger_name):
    with caplog.at_level(level, logger=logger_name):
        yield


@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.parametrize("embedding_dim", [64, 65])
@pytest.mark.parametrize("input_shape", [(10,), (10, 10), (10, 10, 10)], ids=str)
@pytest.mark.parametrize(
    "embedding_class,quant_storage",
    [
        (bnb.nn.Embedding8bit, None),
        (bnb.nn.EmbeddingFP4, torch.uint8),
        (bnb.nn.EmbeddingFP4, torch.float32),
        (bnb.nn.EmbeddingNF4, torch.uint8),
        (bnb.nn.EmbeddingNF4, torch.float32),
    ],
    ids=lambda x: x.__name__ if inspect.isclass(x) else str(x),
)
def test_embedding_lossless(device, embedding_class, input_shape, embedding_dim, quant_storage):
    if device == "hpu":
        if embedding_class is bnb.nn.EmbeddingFP4:
            pytest.skip("FP4 is not supported on HPU")
        elif embedding_class is bnb.nn.EmbeddingNF4 and not is_supported_on_hpu("nf4", torch.float32, quant_storage):
            pytest.skip("This configuration is not supported on HPU")

    num_embeddings = 128

    src_weight = (torch.randn((num_embeddings, embedding_dim), dtype=torch.float32) > 0).to(
        torch.float32
    ) * 2 - 1  # Embeddings filled with {-1, 1} values. It should compress losslessly

    emb_base = nn.Embedding(
        num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
        _freeze=True,
        _weight=src_weight,
    )
    if embedding_class is bnb.nn.Embedding8bit:
        e = embedding_class(num_embeddings=num_embeddings, embedding_dim=embedding_dim)
    else:
        e = embedding_class(num_embeddings=num_embeddings, embedding_dim=embedding_dim, quant_storage=quant_storage)

    e.load_state_dict(emb_base.state_dict())

    emb_base.to(device)
    e.to(device)

    input_tokens = torch.randint(low=0, high=num_embeddings, size=input_shape, device=device)

    torch.testing.assert_close(
        actual=e(input_tokens),
        expected=emb_base(input_tokens),
    )


@pytest.mark.parametrize("device", get_available_devices())
@pytest.mark.parametrize("embedding_dim", [64, 65])
@pytest.mark.parametrize("input_shape", [(10,), (10, 10), (10, 10, 10)], ids=str)
@pytest.mark.parametrize(
    "embedding_class,quant_storage",
    [
        (bnb.nn.Embedding8bit, None),
        (bnb.nn.EmbeddingFP4, torch.uint8),
        (bnb.nn.EmbeddingFP4, torch.float32),
        (bnb.nn.EmbeddingNF4, torch.uint8),
        (bnb.nn.EmbeddingNF4, torch.float32),
    ],
    ids=lambda x: x.__name__ if inspect.isclass(x) else str(x),
)
def test_embedding_error(device, embedding_class, input_shape, embedding_dim, quant_storage):
    if device == "hpu":
        if embedding_class is bnb.nn.EmbeddingFP4:
            pytest.skip("FP4 is not supported on HPU")
        elif embedding_class is bnb.nn.EmbeddingNF4 and not is_supported_on_hpu("nf4", torch.float32, quant_storage):
            pytest.skip("This configuration is not supported on HPU")

    is_8bit = embedding_class is bnb.nn.Embedding8bit

    num_embeddings = 128

    src_weight = torch.rand((num_embeddings, embedding_dim), dtype=torch.float32)

    emb_base = nn.Embedding(
        num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
        _freeze=True,
        _weight=src_weight,
    )
    if is_8bit:
        e = embedding_class(num_embeddings=num_embeddings, embedding_dim=embedding_dim)
    else:
        e = embedding_class(num_embeddings=num_embeddings, embedding_dim=embedding_dim, quant_storage=quant_storage)

    e.load_state_dict(emb_base.state_dict())

    emb_base.to(device)
    e.to(device)

    input_tokens = torch.randint(low=0, high=num_embeddings, size=input_shape, device=device)

    torch.testing.assert_close(
        actual=e(input_tokens),
        expected=emb_base(input_tokens),
        atol=0.05 if is_8bit else 0.20,
        rtol=0.0,
    )


@pytest.mark.parametrize("device", get_available_devices())
def test_4bit_linear_warnings(device, caplog):
    dim1 = 64

    with caplog_at_level(caplog, logging.WARNING, "bitsandbytes_ms.nn.modules"):  # PORT: our logger name
        net = nn.Sequential(*[bnb.nn.Linear4bit(dim1, dim1, quant_type="nf4") for i in range(10)])
        net = net.to(device)
        inp = torch.rand(10, dim1, device=device, dtype=torch.float16)
        net(inp)
    assert any("inference or training" in msg for msg in caplog.messages)

    caplog.clear()
    with caplog_at_level(caplog, logging.WARNING, "bitsandbytes_ms.nn.modules"):  # PORT: our logger name
        net = nn.Sequential(*[bnb.nn.Linear4bit(dim1, dim1, quant_type="nf4") for i in range(10)])
        net = net.to(device)
        inp = torch.rand(1, dim1, device=device, dtype=torch.float16)
        net(inp)
    assert any("inference." in msg for msg in caplog.messages)


@pytest.mark.parametrize("device", get_available_devices())
def test_4bit_embedding_warnings(device, caplog):
    num_embeddings = 128
    default_block_size = 64

    with caplog_at_level(caplog, logging.WARNING, "bitsandbytes_ms.nn.modules"):  # PORT: our logger name
        net = bnb.nn.Embedding4bit(
            num_embeddings=num_embeddings, embedding_dim=default_block_size + 1, quant_type="nf4"
        )
        net.to(device)
        inp = torch.randint(low=0, high=num_embeddings, size=(1,), device=device)
        net(inp)
    assert any("inference" in msg for msg in caplog.messages)


@pytest.mark.parametrize("device", get_available_devices(no_cpu=True))
def test_4bit_embedding_weight_fsdp_fix(device):
    num_embeddings = 64
    embedding_dim = 32

    module = bnb.nn.Embedding4bit(num_embeddings=num_embeddings, embedding_dim=embedding_dim)

    module.to(device)

    module.weight.quant_state = None

    input_tokens = torch.randint(low=0, high=num_embeddings, size=(1,), device=device)

    module(input_tokens)

    assert module.weight.quant_state is not None


@pytest.mark.parametrize("device", get_available_devices(no_cpu=True))
def test_4bit_linear_weight_fsdp_fix(device):
    inp_size = 64
    out_size = 32

    module = bnb.nn.Linear4bit(inp_size, out_size)

    module.to(device)

    module.weight.quant_state = None

    input_tensor = torch.randn((1, inp_size), device=device)

    module(input_tensor)

    assert module.weight.quant_state is not None


def test_embedding_not_implemented_error():
    with pytest.raises(NotImplementedError):
        emb = bnb.nn.Embedding4bit(32, 32)
        emb.state_dict()

    with pytest.raises(NotImplementedError):
        emb = bnb.nn.Embedding8bit(32, 32)
        emb.state_dict()
