"""Dict-shaped batches, as laplace-torch takes them for Hugging Face models: a batch is
a mapping whose entry ``dict_key_y`` holds the targets, and the model takes the whole
mapping. The rest of the module works on one input tensor X (N, ...) that it can
slice, split and ``vmap`` over, so a mapping's per-example tensors are packed into
one X (N, D) in the parameters' dtype, and a wrapper unpacks it before calling the
model. Integer entries (token ids, masks) are exact in X up to 2^23 in float32, 2^52
in float64, and are checked against that.

Shapes: N examples, D the packed width (the entries' per-example sizes summed).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn


class DictInputs:
    """The layout of a mapping's per-example tensors in a packed X (N, D): their keys,
    per-example shapes and dtypes, in the mapping's order."""

    def __init__(self, keys: list[str], shapes: list[tuple], dtypes: list):
        self.keys, self.shapes, self.dtypes = keys, shapes, dtypes
        self.sizes = [int(torch.Size(s).numel()) for s in shapes]

    @classmethod
    def from_batch(cls, batch: Mapping, key_x: str, key_y: str) -> DictInputs:
        """The layout of ``batch``: every tensor entry with N = len(batch[key_x]) rows
        (a missing ``key_x`` raises KeyError, as laplace-torch), ``key_y`` included (the
        model sees the whole mapping, as laplace-torch's does)."""
        n = len(batch[key_x])
        keys, shapes, dtypes = [], [], []
        for key, value in batch.items():
            if not (isinstance(value, Tensor) and value.ndim >= 1 and len(value) == n):
                raise ValueError(
                    f"a dict batch must hold tensors with one row per example; entry "
                    f"{key!r} is not one (dict_key_x={key_x!r} has {n} rows)"
                )
            keys.append(key)
            shapes.append(tuple(value.shape[1:]))
            dtypes.append(value.dtype)
        return cls(keys, shapes, dtypes)

    def pack(self, batch: Mapping, like: Tensor) -> Tensor:
        """X (N, D) in ``like``'s dtype and on its device."""
        if set(batch) != set(self.keys):
            raise ValueError(
                f"the dict has keys {sorted(batch)}; the training batches had "
                f"{sorted(self.keys)}"
            )
        exact = 1 / torch.finfo(like.dtype).eps  # 2^(mantissa bits): 2^23, 2^52
        columns = []
        for key, shape in zip(self.keys, self.shapes, strict=True):
            value = batch[key]
            if tuple(value.shape[1:]) != shape:
                raise ValueError(
                    f"entry {key!r} has shape {tuple(value.shape)}, the training "
                    f"batches had (N, {', '.join(map(str, shape))})"
                )
            if not value.is_floating_point() and bool(value.abs().max() > exact):
                raise ValueError(
                    f"entry {key!r} holds integers beyond {exact:.0f}, which "
                    f"{like.dtype} cannot hold exactly"
                )
            columns.append(value.reshape(len(value), -1).to(like))
        return torch.cat(columns, dim=1)

    def unpack(self, X: Tensor) -> dict[str, Tensor]:
        """The mapping that :meth:`pack` made X from (N, D) → {key: (N, ...)}."""
        parts = X.split(self.sizes, dim=1)
        return {
            key: part.reshape(len(X), *shape).to(dtype)
            for key, part, shape, dtype in zip(
                self.keys, parts, self.shapes, self.dtypes, strict=True
            )
        }


class DictModel(nn.Module):
    """``model`` called on the mapping a packed X stands for; its parameters are the
    model's (named ``model.<name>``)."""

    def __init__(self, model: nn.Module, inputs: DictInputs):
        super().__init__()
        self.model, self.inputs = model, inputs

    def forward(self, X: Tensor) -> Tensor:
        return self.model(self.inputs.unpack(X))
