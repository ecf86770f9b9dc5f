"""One step's LoRA work: which rows of the flat batch run which adapter.

The model runner builds a StepLora from the step's sequences (ModelRunner.execute)
and passes it to the model's forward; each decoder layer hands its LayerLora to the
projections, and after each projection `add` adds scale * (x_g @ A^T) @ B^T to the
rows of every adapter group g (the scale is in B: adapter.py). Base rows are never
touched, and a step whose rows are all base has no StepLora at all: it costs nothing.

On a CPU a tiny matmul per adapter and module costs more in dispatch than in
arithmetic (a decode step has a few rows per adapter), so the step's adapters are
stacked (AdapterStack: per layer and module, [adapters, in, width] and [adapters,
width, out], zero-padded to the widest) and a projection is one gather of the
adapter rows into [adapters, most rows, in], two batched matmuls and one
scatter-add, whatever the number of adapters. Groups shorter than the longest are
padded with their own first row, its update zeroed and added back to that row.
Where padding would more than double the rows (a long prefill chunk of one adapter
beside a few decodes of others), the groups run one by one on views of the stack.
The stack is built when a step's set of adapters changes and reused while it does
not (the runner keeps the last one): copying the weights every step would cost more
than the products.

That is the torch path's arithmetic (the eager and compiled compute paths). The
native path reads the same stack from C++ (native/lora.h, through
native_layers.Native): each row's adapter index (`row_adapter`) picks its pair, so
it needs neither the gather nor the padding.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    # Annotations only: adapter.py reads the model's packing, and the model imports this.
    from maas_services.engine.lora.adapter import AdapterWeights


@dataclass
class Stacked:
    """One module's pairs, one per adapter of the stack, zero-padded to one width."""

    a_t: torch.Tensor  # [adapters, in_features, width]
    b_t: torch.Tensor  # [adapters, width, out_features]


class AdapterStack:
    """The step's adapters' weights stacked: per layer, module -> Stacked."""

    def __init__(self, adapters: "tuple[AdapterWeights, ...]"):
        self.adapters = adapters  # held: the key is their identities
        self.key = tuple(id(weights) for weights in adapters)
        # Every layer of an adapter has the same modules (adapter.py).
        modules = sorted({module for weights in adapters for module in weights.layers[0]})
        self.layers = [
            {module: _stack(adapters, layer, module) for module in modules}
            for layer in range(len(adapters[0].layers))
        ]


@dataclass
class Padded:
    """Every group's rows at once: [adapters x most rows] gather and scatter indices."""

    gather: torch.Tensor  # batch row of each padded slot; padding repeats the group's first
    keep: torch.Tensor  # [adapters, most rows, 1]: 1 for a real row, 0 for padding


@dataclass
class LayerLora:
    """One layer's share of the step."""

    modules: dict[str, Stacked]
    padded: Padded | None  # None: groups one by one (module docstring)
    groups: list[torch.Tensor]  # each adapter's batch rows, in stack order
    step: "StepLora"  # the step it is part of: a native path reads its stack and rows
    index: int  # the layer's

    def add(self, module: str, x: torch.Tensor, out: torch.Tensor) -> None:
        """out (the module's output for input x) gains each row's adapter's update."""
        stacked = self.modules.get(module)
        if stacked is None:
            return
        if self.padded is not None:
            count = stacked.a_t.shape[0]
            xs = x.index_select(0, self.padded.gather).view(count, -1, x.shape[1])
            low = torch.bmm(xs, stacked.a_t).mul_(self.padded.keep)
            update = torch.bmm(low, stacked.b_t).view(-1, out.shape[1])
            out.index_add_(0, self.padded.gather, update)
            return
        for g, rows in enumerate(self.groups):
            low = x.index_select(0, rows) @ stacked.a_t[g]
            out.index_add_(0, rows, low @ stacked.b_t[g])


class StepLora:
    def __init__(
        self,
        stack: AdapterStack,
        padded: Padded | None,
        groups: list,
        row_adapter: torch.Tensor,
    ):
        self.stack = stack
        # int64 [rows]: each batch row's adapter, its index in the stack, -1 for the base.
        self.row_adapter = row_adapter
        self._layers = [
            LayerLora(modules, padded, groups, self, i) for i, modules in enumerate(stack.layers)
        ]

    @classmethod
    def build(
        cls,
        spans: list[tuple[str, int, int]],
        weights: "dict[str, AdapterWeights]",
        device: torch.device | str,
        last: AdapterStack | None = None,
    ) -> "StepLora | None":
        """From (adapter, first row, end row) per sequence in batch order ("" = base);
        None when no row runs an adapter. `last`: the previous step's stack, reused when
        this step holds the same adapters."""
        rows: dict[str, list[int]] = {}
        for name, start, end in spans:
            if name and end > start:
                rows.setdefault(name, []).extend(range(start, end))
        if not rows:
            return None
        names = sorted(rows)
        adapters = tuple(weights[name] for name in names)
        stack = last
        if stack is None or stack.key != tuple(id(w) for w in adapters):
            stack = AdapterStack(adapters)
        row_adapter = [-1] * max(end for _, _, end in spans)
        for index, name in enumerate(names):
            for row in rows[name]:
                row_adapter[row] = index
        row_adapter = torch.tensor(row_adapter, dtype=torch.int64, device=device)
        longest = max(len(r) for r in rows.values())
        total = sum(len(r) for r in rows.values())
        if longest * len(names) > 2 * total:
            groups = [torch.tensor(rows[name], device=device) for name in names]
            return cls(stack, None, groups, row_adapter)
        gather, keep = [], []
        for name in names:
            own = rows[name]
            padding = longest - len(own)
            gather += own + [own[0]] * padding
            keep += [1] * len(own) + [0] * padding
        dtype = next(iter(stack.layers[0].values())).a_t.dtype
        padded = Padded(
            torch.tensor(gather, device=device),
            torch.tensor(keep, dtype=dtype).view(len(names), longest, 1).to(device),
        )
        return cls(stack, padded, [], row_adapter)

    def layer(self, index: int) -> LayerLora:
        return self._layers[index]


def _stack(adapters: "tuple[AdapterWeights, ...]", layer: int, module: str) -> Stacked:
    pairs = [w.layers[layer].get(module) for w in adapters]
    present = [p for p in pairs if p is not None]
    in_features, out_features = present[0].a_t.shape[0], present[0].b_t.shape[1]
    width = max(p.a_t.shape[1] for p in present)
    like = present[0].a_t
    a_t = like.new_zeros(len(adapters), in_features, width)
    b_t = like.new_zeros(len(adapters), width, out_features)
    for i, pair in enumerate(pairs):
        if pair is not None:
            a_t[i, :, : pair.a_t.shape[1]] = pair.a_t
            b_t[i, : pair.b_t.shape[0]] = pair.b_t
    return Stacked(a_t, b_t)
