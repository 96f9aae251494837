"""GGUF matrices as torch modules: a linear layer and a token embedding read in place.

The kernels' bindings work on numpy arrays; these modules convert at their edge with
views (``Tensor.numpy()``, ``torch.from_numpy``), so no activation or weight is copied.
"""

from __future__ import annotations

import torch

from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels


class GGUFLinear(torch.nn.Module):
    """A linear layer whose weight is a GGUF matrix read in place by the engine's kernels.

    Activations are multiplied in float32 after being rounded to 8 bits per block (as
    llama.cpp does); the output goes back to the input's dtype.
    """

    bias: torch.Tensor | None
    order: torch.Tensor | None

    def __init__(
        self,
        matrix: gguf_kernels.Matrix,
        bias: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
    ) -> None:
        """Keep the matrix; ``order[i]`` is the file row that gives output ``i`` (or None)."""
        super().__init__()
        self.matrix = matrix
        self.in_features, self.out_features = matrix.k, matrix.n
        self.register_buffer("bias", bias)
        self.register_buffer("order", order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for any leading shape."""
        flat = x.reshape(-1, self.in_features)
        flat = flat if flat.dtype == torch.float32 else flat.float()
        out = torch.from_numpy(self.matrix.linear(flat.detach().numpy()))
        if self.order is not None:
            out = out.index_select(1, self.order)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        kind = gguf_kernels.type_name(self.matrix.type_id)
        return f"in={self.in_features}, out={self.out_features}, {kind} in place"


class GGUFEmbedding(torch.nn.Module):
    """A token embedding read in place from a GGUF matrix: looked-up rows are dequantized."""

    def __init__(self, matrix: gguf_kernels.Matrix, dtype: torch.dtype) -> None:
        """Keep the ``[vocab, dim]`` matrix; rows come out in ``dtype``."""
        super().__init__()
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.n, matrix.k
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``ids`` (int64 or int32, as torch.nn.Embedding takes), any shape."""
        # transformers' continuous batching passes int32 ids; the kernel reads int64.
        rows = torch.from_numpy(self.matrix.rows(ids.reshape(-1).to(torch.int64).numpy()))
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        kind = gguf_kernels.type_name(self.matrix.type_id)
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind} in place"
