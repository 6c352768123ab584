"""A step that runs the model again after ``optimizer.step()``: its program, cut at the update.

A loop may compute something after the update in the same step (a metric on the updated
weights, an eval forward every step)::

    loss.backward(); optimizer.step()
    model.eval()
    with torch.no_grad():
        val = loss_fn(model(xv), yv)      # eager PyTorch: the weights after this step's update
    model.train()

The whole step is one captured graph; the driver's replay puts an :data:`UPDATE_MARKER` output
at the place of ``optimizer.step()`` (:meth:`csrun.driver.recorded_step.Recording.replay_forward`),
and the graph's nodes are in the order they ran. :func:`split_at_update` cuts the graph there
into two: :attr:`SplitStep.before` (the forward up to the loss and what was computed before the
update) and :attr:`SplitStep.after` (what came after it), which the engine runs after the
update, under ``no_grad``. The weights and buffers are read afresh by each part, so the second
sees the updated weights and the running statistics the first part changed; values the second
part uses from the first are handed over (:attr:`SplitStep.carried`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils import _pytree as pytree

UPDATE_MARKER = "__update__"
"""The output whose node stands where the update happens (the driver's name for it)."""


@dataclass(frozen=True)
class SplitStep:
    """A program cut at its update (see the module manual)."""

    before: GraphModule
    """(batch leaves...) -> the outputs named :attr:`before_names`, then the carried values."""
    after: GraphModule
    """(batch leaves..., carried values...) -> the outputs named :attr:`after_names`."""
    before_names: tuple[str, ...]
    after_names: tuple[str, ...]
    carried: int
    """How many values the second part takes from the first."""

    def run_before(self, inputs: Any) -> tuple[dict[str, Any], list[Any]]:
        """The first part on a batch: its outputs by name, and the values to carry."""
        leaves = pytree.tree_leaves(inputs)
        flat = self.before(*leaves)
        n = len(self.before_names)
        return dict(zip(self.before_names, flat[:n])), list(flat[n:])

    def run_after(self, inputs: Any, carried: list[Any]) -> dict[str, Any]:
        """The second part (after the update) on the same batch: its outputs by name."""
        leaves = pytree.tree_leaves(inputs)
        with torch.no_grad():
            flat = self.after(*leaves, *[c.detach() if isinstance(c, torch.Tensor) else c for c in carried])
        return dict(zip(self.after_names, flat))


def output_names(module: GraphModule) -> list[str] | None:
    """The names of a captured step's flat outputs (a mapping's keys), or None when it returns no mapping."""
    info = getattr(module.graph._codegen, "pytree_info", None)
    spec = getattr(info, "out_spec", None)
    if spec is None or spec.type is not dict:
        return None
    return [str(k) for k in spec.context]


def split_at_update(module: GraphModule) -> SplitStep | None:
    """Cut ``module`` (an unlifted captured step) at its :data:`UPDATE_MARKER`; None when it has none."""
    names = output_names(module)
    if names is None or UPDATE_MARKER not in names:
        return None
    graph = module.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    flat = list(pytree.tree_leaves(output.args[0]))
    if len(flat) != len(names):
        return None
    by_name = dict(zip(names, flat))
    order = {n: i for i, n in enumerate(graph.nodes)}
    cut = order[by_name[UPDATE_MARKER]]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    def late(n: Node) -> bool:
        return n.op == "call_function" and order[n] > cut

    early_names = [k for k in names if k != UPDATE_MARKER and not _is_late(by_name[k], late)]
    late_names = [k for k in names if k != UPDATE_MARKER and _is_late(by_name[k], late)]
    late_nodes = [n for n in graph.nodes if late(n)]
    carried = [a for a in _inputs_of(late_nodes) if a.op == "call_function" and order[a] < cut]
    before = _build(module, placeholders, [n for n in graph.nodes if n.op == "call_function" and order[n] < cut],
                    [by_name[k] for k in early_names] + carried, extra_inputs=[])
    after = _build(module, placeholders, late_nodes, [by_name[k] for k in late_names], extra_inputs=carried)
    return SplitStep(before=before, after=after, before_names=tuple(early_names), after_names=tuple(late_names),
                     carried=len(carried))


def _is_late(node: Any, late: Any) -> bool:
    return isinstance(node, Node) and late(node)


def _inputs_of(nodes: list[Node]) -> list[Node]:
    """The nodes ``nodes`` read, each once, in first-use order."""
    seen: dict[Node, None] = {}
    members = set(nodes)
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members:
                seen.setdefault(a, None)
    return list(seen)


def _build(root: GraphModule, placeholders: list[Node], body: list[Node], outputs: list[Any],
           extra_inputs: list[Node]) -> GraphModule:
    """A flat graph module: the batch's placeholders and ``extra_inputs`` in, ``body`` (with the
    attributes it reads), ``outputs`` out as a tuple."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for p in placeholders:
        env[p] = graph.placeholder(p.name)
    for i, n in enumerate(extra_inputs):
        env[n] = graph.placeholder(f"carried_{i}")

    def copy_attr(a: Node) -> Node:
        if a not in env:
            env[a] = graph.get_attr(a.target)  # type: ignore[arg-type]  # a get_attr's target is its path
        return env[a]

    for n in body:
        for a in n.all_input_nodes:
            if a.op == "get_attr":
                copy_attr(a)
        env[n] = graph.node_copy(n, lambda a: env[a])
    for out in outputs:
        if isinstance(out, Node) and out.op == "get_attr":
            copy_attr(out)
    graph.output(tuple(env[o] if isinstance(o, Node) else o for o in outputs))
    return GraphModule(root, graph)
