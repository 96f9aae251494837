"""The C forward driven from numpy alone gives the torch path's logits on the bundled model.

A process where torch and transformers cannot be imported builds a Decoder for the bundled
SmolLM2 file the way a CPU runner without torch would (issue 57): matrices over the file's
mapping, norms dequantized with gguf's numpy ``dequantize``, Q/K row orders worked out
from the head counts, config and rotary tables from gguf_config.py and rope.py. It runs a
prompt and greedy decodes. With the torch path's own cos and sin tables handed in, its
logits equal NativeForward's bit for bit (the same C calls on the same values); with
rope.py's tables, which may differ from torch's by one ulp in places (rope.py's docstring),
the tokens are the same and the logits within ROPE_BOUND (percents, not ulps: see there).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.model.loader import bundled_gguf_path, load_model
from paged_llm.engine.model.native_forward import NativeForward
from paged_llm.engine.model.native_model import NativeModel
from paged_llm.kernels.cpu import forward as cpu_forward
from tests.helpers.support import CACHE

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)
ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 9690, 314, 253, 1789, 30, 1050, 325, 260, 1812, 282, 4649, 47, 2]
STEPS = 6
BLOCK_SIZE = 16
# Relative to the logits' spread. rope.py's tables differ from torch's by one ulp in some
# entries (84 of 1,280 cos and 28 of 1,280 sin values over these 20 positions); the 8-bit
# rounding of activations before each quantized product turns such an ulp into a step of
# a code now and then, which 30 layers carry to the logits: measured up to 1.6% of the
# spread, as much as flipping one ulp in a random 5% of torch's own table entries gives.
ROPE_BOUND = 0.03

Forward = Callable[..., np.ndarray]


def greedy(forward: Forward, prompt: list[int], steps: int) -> list[np.ndarray]:
    """Every row's logits of the prompt (one prefill step), then of ``steps`` greedy decodes.

    One sequence whose block table is blocks 0, 1, ...: a position's KV slot is itself.
    ``forward(ids, positions, seqs, slots, tables, keep)`` runs one step.
    """
    tables = np.arange(len(prompt) + steps + 1, dtype=np.int32)[None]
    ids = np.array(prompt, dtype=np.int64)
    positions = np.arange(len(prompt), dtype=np.int64)
    out: list[np.ndarray] = []
    while True:
        rows = len(ids)
        seqs = np.zeros(rows, dtype=np.int64)
        logits = forward(ids, positions, seqs, positions, tables, np.arange(rows))
        out.append(logits)
        if len(out) > steps:
            return out
        ids = np.array([int(np.argmax(logits[-1]))], dtype=np.int64)
        positions = positions[-1:] + 1


# Builds the Decoder from the file with torch and transformers unimportable, runs greedy()
# with the torch path's tables (from tables_path) and with rope.py's, and saves the logits.
CHILD = textwrap.dedent(
    """
    from __future__ import annotations

    import importlib.abc, sys, types

    BLOCKED = ("torch", "transformers", "triton", "xgrammar")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    # paged_llm.engine's __init__ checks for the torch extra: a bare package stands in.
    engine = types.ModuleType("paged_llm.engine")
    engine.__path__ = [{root!r} + "/engine"]
    sys.modules[engine.__name__] = engine

    from pathlib import Path

    import numpy as np
    from gguf import dequantize

    from paged_llm.engine.model import gguf_file, rope
    from paged_llm.engine.model.gguf_config import read_config
    from paged_llm.kernels.cpu import forward as cpu_forward
    from paged_llm.kernels.cpu.gguf_matmul import TYPES, Matrix

    path, kv, block_size, blocks = {path!r}, {kv!r}, {block_size!r}, {blocks!r}
    config = read_config(path)
    file = gguf_file.read(Path(path))
    tensors = {{t.name: t for t in file.tensors}}

    def matrix(name):
        info = tensors[name]
        k, n = info.shape
        return Matrix(file.data(info), TYPES[info.type_name], n, k)

    def vector(name):
        info = tensors[name]
        raw = file.data(info)
        raw = raw.view(np.float32) if info.type_name == "F32" else raw
        return dequantize(raw, info.type).astype(np.float32).reshape(-1)

    def order(rows, heads):
        # llama.cpp interleaves each head's rotary halves; transformers' GGUF loader undoes
        # it, so output i is the file's row order[i]
        ids = np.arange(rows).reshape(heads, rows // heads // 2, 2)
        return ids.swapaxes(2, 1).reshape(-1).astype(np.int64)

    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    # numpy has no bfloat16: its pools hold the bits as uint16 and the Decoder is told
    dtype = np.uint16 if kv == "bfloat16" else np.dtype(kv)
    shape = (blocks, block_size, kv_heads, dim)
    layers = []
    for i in range(config.num_hidden_layers):
        blk = f"blk.{{i}}."
        linear = {{
            part: cpu_forward.Linear(matrix(blk + part + ".weight"))
            for part in ("attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        }}
        layers.append(
            cpu_forward.Layer(
                vector(blk + "attn_norm.weight"),
                vector(blk + "ffn_norm.weight"),
                cpu_forward.Linear(matrix(blk + "attn_q.weight"), order=order(heads * dim, heads)),
                cpu_forward.Linear(
                    matrix(blk + "attn_k.weight"), order=order(kv_heads * dim, kv_heads)
                ),
                linear["attn_v"], linear["attn_output"],
                linear["ffn_gate"], linear["ffn_up"], linear["ffn_down"],
                np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype),
                window=config.window(i),
            )
        )
    embed = matrix("token_embd.weight")
    head = "token_embd.weight" if config.tie_word_embeddings else "output.weight"
    decoder = cpu_forward.Decoder(
        embed, layers, vector("output_norm.weight"), cpu_forward.Linear(matrix(head)),
        heads=heads, kv_heads=kv_heads, head_dim=dim, eps=config.rms_norm_eps,
        scale=config.attention_scale, kv_dtype=kv,
    )

    {greedy}

    def run(cos_table, sin_table):
        for layer in layers:  # a fresh pool for each run
            layer.key_cache[...] = 0
            layer.value_cache[...] = 0
        def forward(ids, positions, seqs, slots, tables, keep):
            cos, sin = cos_table[positions], sin_table[positions]
            return decoder.forward(ids, positions, seqs, slots, tables, cos, sin, keep)
        return greedy(forward, {prompt!r}, {steps!r})

    given = np.load({tables_path!r})
    theirs = run(given["cos"], given["sin"])
    ours = run(*rope.cos_sin(config.rope, len({prompt!r}) + {steps!r}))
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    np.savez({out_path!r}, *theirs, *ours)
    """
)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_a_decoder_built_from_numpy_alone_gives_the_torch_paths_logits(
    tmp_path: Path, kv: str
) -> None:
    """Bit for bit on the torch path's rotary tables; rope.py's: same tokens, ROPE_BOUND."""
    loaded = load_model(
        EngineConfig(model=DEFAULT_MODEL, device="cpu", cache_dir=CACHE / "inplace")
    )
    model = loaded.model
    assert isinstance(model, NativeModel)
    config = model.config
    blocks = (len(PROMPT) + STEPS) // BLOCK_SIZE + 1
    shape = (blocks, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    dtype = getattr(torch, kv)
    pools = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        for _ in range(config.num_hidden_layers)
    ]
    native = NativeForward(model, pools)

    def forward(*step: np.ndarray) -> np.ndarray:
        """The torch path's step on views of the numpy inputs."""
        return native.forward(*(torch.from_numpy(a) for a in step)).numpy()

    want = greedy(forward, PROMPT, STEPS)
    # The tables NativeForward looked each position's cos and sin up in.
    cos, sin = native._cos_sin(torch.arange(len(PROMPT) + STEPS), None)
    tables_path, out_path = tmp_path / "tables.npz", tmp_path / "logits.npz"
    np.savez(tables_path, cos=cos.numpy(), sin=sin.numpy())
    source = CHILD.format(
        root=str(ROOT),
        path=str(bundled_gguf_path("SmolLM2-135M-Instruct")),
        kv=kv,
        block_size=BLOCK_SIZE,
        blocks=blocks,
        prompt=PROMPT,
        steps=STEPS,
        tables_path=str(tables_path),
        out_path=str(out_path),
        greedy=inspect.getsource(greedy),
    )
    done = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = np.load(out_path)
    got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    theirs, ours = got[: len(want)], got[len(want) :]
    assert len(ours) == len(want) == STEPS + 1
    for a, b in zip(theirs, want, strict=True):
        assert a.shape == b.shape
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    tokens = [[int(np.argmax(step[-1]))] for step in want]
    assert tokens == [[int(np.argmax(step[-1]))] for step in ours]
    for a, b in zip(ours, want, strict=True):
        assert np.abs(a - b).max() <= ROPE_BOUND * (b.max() - b.min())


def test_the_bindings_import_no_torch() -> None:
    """paged_llm.kernels.cpu's bindings import where torch cannot be imported."""
    probe = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError(f"{name} is blocked in this test")
                return None

        sys.meta_path.insert(0, Block())
        from paged_llm.kernels.cpu import attention, forward, gguf_matmul, native_build
        import paged_llm.kernels as kernels

        try:
            kernels.paged_attention
        except ImportError as err:
            print(type(err).__name__)
        assert not any(n == "torch" or n.startswith("torch.") for n in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "EngineExtraMissing"


def test_the_decoder_refuses_pools_it_cannot_read() -> None:
    """Torch tensors, bfloat16 bits without kv_dtype, pools of different dtypes: ValueError."""
    embed = cpu_forward.gguf_kernels.Matrix(
        np.zeros(8 * 16 * 4, dtype=np.uint8), cpu_forward.gguf_kernels.TYPES["F32"], 8, 16
    )
    linear = cpu_forward.Linear

    def decoder(keys: Any, values: Any, kv_dtype: str | None = None) -> None:
        """A one-layer decoder over the given pools."""
        mats = [
            cpu_forward.gguf_kernels.Matrix(
                np.zeros(n * k * 4, dtype=np.uint8), cpu_forward.gguf_kernels.TYPES["F32"], n, k
            )
            for n, k in ((16, 16), (16, 16), (16, 16), (16, 16), (32, 16), (32, 16), (16, 32))
        ]
        ones = np.ones(16, dtype=np.float32)
        layer = cpu_forward.Layer(ones, ones, *(linear(m) for m in mats), keys, values)
        cpu_forward.Decoder(
            embed, [layer], ones, linear(embed), heads=1, kv_heads=1, head_dim=16, eps=1e-5,
            scale=0.25, kv_dtype=kv_dtype,
        )  # fmt: skip

    pool = np.zeros((2, 4, 1, 16), dtype=np.float32)
    decoder(pool, pool)  # what it takes
    bits = np.zeros(pool.shape, dtype=np.uint16)
    decoder(bits, bits, "bfloat16")
    with pytest.raises(ValueError, match="must be a numpy array, got Tensor"):
        decoder(torch.from_numpy(pool), torch.from_numpy(pool))
    with pytest.raises(ValueError, match="uint16 with kv_dtype='bfloat16'"):
        decoder(bits, bits)
    with pytest.raises(ValueError, match="a bfloat16 KV pool must be a uint16 array"):
        decoder(pool, pool, "bfloat16")
    with pytest.raises(ValueError, match="share one dtype"):
        decoder(pool, pool.astype(np.float16))
    with pytest.raises(ValueError, match="contiguous"):
        decoder(pool, np.zeros((2, 4, 1, 32), dtype=np.float32)[..., ::2])
