"""Marginal ancestral state probabilities from the post- and pre-order partials."""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from ..data import Alignment
from .._errors import InputError
from ..tree import Schedule, Tree
from ..models import Model
from ._api import prepare
from ._arrays import PatternData, kernel_arrays, layout_lengths
from .kernels import marginals, post_order_partials, pre_order_partials


@eqx.filter_jit
def _kernel_marginals(model: Model, branch_lengths, data: PatternData, schedule: Schedule, index, dtype):
    arrays = kernel_arrays(model, layout_lengths(branch_lengths, index, schedule), data, dtype)
    transition, pi, weights, codes, table = arrays
    post, _ = post_order_partials(transition, codes, table, schedule)
    pre, _ = pre_order_partials(transition, pi, weights, post, codes, table, schedule)
    return marginals(pre, post)[0, :-1]


def slots_of(tree: Tree, schedule: Schedule, index: np.ndarray) -> np.ndarray:
    """The schedule slot of every user node (-1 for tips and where a unifurcation was merged away)."""
    layout = np.asarray(schedule.layout[0])
    n = tree.num_tips
    slot = np.full(tree.topology.num_nodes + 1, -1)
    kernel_nodes = layout[n:n + schedule.num_slots]
    real = kernel_nodes < len(index) - 1
    slot[index[kernel_nodes[real]]] = np.flatnonzero(real)
    return slot[:-1]


def ancestral_marginals(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64"
) -> Float[Array, "internal_nodes sites states"]:
    """`P(state of node k at site j = x | alignment)` for every internal node of `tree`.

    Row `k - tree.num_tips` is the tree's node `k`; sites are alignment columns
    (codons for codon data); states follow `model.alphabet`. Rate categories are
    summed over: `sum_r q_k,r(x) p_k,r(x) / L_j`, with `q` the pre-order partials.
    """
    data, schedule, index, dtype = prepare(alignment, tree, model, precision)
    slots = slots_of(tree, schedule, index)[tree.num_tips:]
    if (slots < 0).any():
        node = tree.num_tips + int(np.argmax(slots < 0))
        raise InputError(f"internal node {node} has a single child; remove unifurcations first")
    per_pattern = _kernel_marginals(model, tree.branch_lengths, data, schedule, index, dtype)
    return per_pattern[slots][:, alignment.site_patterns().site_pattern]
