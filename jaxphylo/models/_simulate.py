"""Simulating alignments under a model, for tests and examples."""

from __future__ import annotations

import numpy as np

from ..data import Alignment
from ..tree import Tree
from ._model import Model


def simulate(tree: Tree, model: Model, num_sites: int, seed: int = 0, missing: float = 0.0) -> Alignment:
    """Sequences evolved down `tree` under `model`, one rate category drawn per site.

    With `missing > 0`, that fraction of tip cells is replaced by the gap symbol.
    """
    rng = np.random.default_rng(seed)
    topology = tree.topology
    transition = np.asarray(model.transition_matrices(tree.branch_lengths))
    _, weights = model.rate_categories()
    pi = np.asarray(model.frequencies, float)
    category = rng.choice(len(weights), size=num_sites, p=np.asarray(weights) / np.sum(weights))
    states = np.zeros((topology.num_nodes, num_sites), np.int64)
    states[topology.root] = _draw(rng, np.broadcast_to(pi, (num_sites, len(pi))))
    for node in range(topology.num_nodes - 2, -1, -1):  # parents come after children
        rows = transition[node, category, states[topology.parent[node]]]
        states[node] = _draw(rng, rows)
    symbols = np.array(model.alphabet.states)
    tips = symbols[states[: topology.num_tips]]
    if missing > 0:
        gap = "-" * model.alphabet.symbol_width
        tips = np.where(rng.random(tips.shape) < missing, gap, tips)
    sequences = tuple("".join(row) for row in tips)
    return Alignment(topology.taxa, sequences, model.alphabet, "<simulated>")


def _draw(rng, probabilities):
    cumulative = np.cumsum(probabilities, axis=-1)
    u = rng.random(len(probabilities))[:, None] * cumulative[:, -1:]
    return (u > cumulative).sum(axis=-1).clip(max=probabilities.shape[-1] - 1)
