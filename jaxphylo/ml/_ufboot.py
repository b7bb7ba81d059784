"""Ultrafast bootstrap (UFBoot: Minh, Nguyen & von Haeseler 2013; UFBoot2: Hoang et al. 2018).

`R` bootstrap replicates are drawn once, as pattern counts (a partitioned
alignment's sites within each part). While the search climbs, every tree it
NNI-scores and each of that tree's `2 (n - 3)` NNI neighbours (central branch
fitted) is scored under every replicate by RELL (Kishino, Miyata & Hasegawa
1990), `log L*_r = sum_p c_rp log L_p`: the per-pattern log-likelihoods are
computed once and resampling is one product (`nni_scores(..., rell=counts)`).
Each replicate keeps the best tree it has met. The trees are offered one at a
time, in the order the search meets them (a batch's rows in order; each tree
stands for itself or, where one beats it on the replicate, its best NNI
neighbour). An offer within `tie` of the kept tree's RELL log L is a tie: it
replaces the kept tree with probability `1/(c + 1)`, `c` the ties accepted
since the kept log L last rose by more than `tie`, and a tree met again is
offered again (UFBoot2's rule as IQ-TREE 2 applies it: without a tie rule
whichever tree the search met first would win, e.g. among trees that differ
only across a zero-length branch; since accepted ties alone raise `c`, trees
met often and late keep more replicates than a draw uniform over distinct
topologies gives them, though on DS1 the two rules' supports differ by 0.2 on
average, `validation/ml/ufboot_cpu_experiments.json`). A split's support is the
percentage of replicates whose kept tree has it. As in IQ-TREE, a tree whose
log L (on the alignment itself) is more than `CUTOFF_MARGIN` below that of
the worst tree any replicate keeps is not a candidate (`floor`): it saves
nothing here (the RELL products are batched), but it is the rule IQ-TREE's
supports are calibrated with, and it keeps poor trees met early in the
search, whose lengths were fitted only roughly, out of the replicates.

The search goes on until the supports settle (`settled`): after its own stop
rule, every `check_every` perturbed trees the supports of all splits met are
compared with those at the previous check, and it stops when their
correlation is at least `min_correlation` (IQ-TREE's `-bcor 0.99`) or after
`max_perturbed` perturbed trees (IQ-TREE's `-nm 1000`): `UFBootSettings`.

With `bnni` (UFBoot2's `-bnni`), every replicate's kept tree is then
NNI-climbed on that replicate's own counts under the fitted model, which
lowers the supports that model violations inflate.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from .._errors import InputError
from ..tree import Tree, TreeBatch, kernel_splits

CUTOFF_MARGIN = 1.0  # trees more than this below the worst kept tree's log L are not candidates (IQ-TREE's rule)
MIN_REPLICATES = 1000  # IQ-TREE's rule: UFBoot's supports are calibrated with at least 1,000 replicates


@dataclass(frozen=True)
class UFBootSettings:
    """Ultrafast bootstrap settings; the defaults and the names in brackets are IQ-TREE 2's."""

    replicates: int = 1000  # bootstrap replicates (-B), at least MIN_REPLICATES
    bnni: bool = False  # NNI-climb every replicate's tree on its own counts at the end (-bnni)
    check_every: int = 100  # perturbed trees between two checks of the supports (-nstep)
    max_perturbed: int = 1000  # perturbed trees at most while the supports settle (-nm)
    min_correlation: float = 0.99  # the supports of two checks correlate this much: settled (-bcor)
    tie: float = 0.5  # RELL log L closer than this tie (-beps)

    def __post_init__(self):
        if self.replicates < MIN_REPLICATES:
            raise InputError(f"ultrafast bootstrap needs at least {MIN_REPLICATES} replicates (IQ-TREE's rule), "
                             f"got {self.replicates}")
        if self.check_every < 1 or self.max_perturbed < 0 or not 0 < self.min_correlation <= 1 or self.tie < 0:
            raise InputError(f"invalid ultrafast bootstrap settings: {self}")


def rell_counts(weights: np.ndarray, part_of_pattern, replicates: int, rng) -> np.ndarray:
    """RELL pattern counts `[R, P]`: each part's sites resampled within the part (IQ-TREE's rule for partitions).
    Patterns of weight 0 (padding) are never drawn."""
    if part_of_pattern is None:
        return rng.multinomial(int(weights.sum()), weights / weights.sum(), size=replicates)
    counts = np.zeros((replicates, len(weights)), np.int64)
    for part in np.unique(part_of_pattern):
        own = part_of_pattern == part
        counts[:, own] = rng.multinomial(int(weights[own].sum()), weights[own] / weights[own].sum(), size=replicates)
    return counts


class UFBoot:
    """The replicates' counts and, per replicate, the best tree met so far (`observe`), its RELL log L and
    the number of ties accepted for it. Plain NumPy between calls (`state`/`restore`: checkpoints)."""

    def __init__(self, settings: UFBootSettings, weights: np.ndarray, part_of_pattern, seed: int, taxa):
        self.settings, self.taxa = settings, tuple(taxa)
        replicates = settings.replicates
        rng = np.random.default_rng([seed, 0x0F_B007])
        self.counts = rell_counts(np.asarray(weights), part_of_pattern, replicates, rng).astype(np.float64)
        self.rng = np.random.default_rng([seed, 0x71E5])  # tie draws: their own stream
        self.best = np.full(replicates, -np.inf)
        self.original = np.full(replicates, -np.inf)  # the kept trees' log L on the alignment itself
        self.ties = np.zeros(replicates, np.int64)  # ties accepted since each replicate's best last rose
        self.parents, self.lengths, self.keys = None, None, [None] * replicates
        self.checked, self.checked_at = None, 0
        self._keys: dict[bytes, frozenset] = {}
        self._device: dict = {}

    def device_counts(self, dtype):
        """The counts as a device array (made once per dtype: every NNI round reads them)."""
        if dtype not in self._device:
            self._device[dtype] = jnp.asarray(self.counts, dtype)
        return self._device[dtype]

    def floor(self, dtype):
        """The least log L a tree needs to be a candidate (-inf until every replicate keeps a tree)."""
        return jnp.asarray(np.min(self.original) - CUTOFF_MARGIN, dtype)

    @property
    def replicates(self) -> int:
        return len(self.best)

    def key(self, parents: np.ndarray) -> frozenset:
        """A topology's split set (cached: the search meets the same trees again and again)."""
        raw = parents.tobytes()
        if raw not in self._keys:
            self._keys[raw] = frozenset(x for x in kernel_splits(parents, self.taxa) if x is not None)
        return self._keys[raw]

    def observe(self, parents, lengths, scores) -> None:
        """Offer each of the batch's trees (`scores`: `NNIScores` with `rell`), in row order, to every replicate:
        the tree itself, or its best NNI neighbour on that replicate where the neighbour beats it or the tree is
        below the cutoff (`floor`; the neighbours below it were left out by `nni_scores`). Each offer that beats
        the kept tree by more than `tie` is kept; one within `tie` of it is kept with probability
        `1/(ties + 1)` (see the module docstring)."""
        rell = scores.rell
        raw, gain, move = (np.asarray(x) for x in (rell.tree, rell.gain, rell.move))  # [B, R]
        own = np.asarray(rell.log_likelihood)
        eligible = (own >= np.min(self.original) - CUTOFF_MARGIN)[:, None]
        neighbour = np.isfinite(gain) & ((gain > 0) | ~eligible)
        value = np.where(neighbour, raw + np.where(neighbour, gain, 0.0), np.where(eligible, raw, -np.inf))
        offered, tie = np.full(self.replicates, -1), self.settings.tie
        for j in range(value.shape[0]):
            v = value[j]
            better = v > self.best + tie
            won = ~better & (v > self.best - tie) & (self.rng.random(self.replicates) * (self.ties + 1) < 1)
            self.ties = np.where(better, 1, self.ties + won)
            self.best = np.where(better, v, np.where(won, np.maximum(self.best, v), self.best))
            offered[better | won] = j
        kept = np.flatnonzero(offered >= 0)
        if not len(kept):
            return
        parents, lengths = np.asarray(parents), np.asarray(lengths)
        nodes, fitted, gains = np.asarray(scores.nodes), np.asarray(scores.lengths), np.asarray(scores.gains)
        if self.parents is None:
            self.parents = np.repeat(parents[:1], self.replicates, axis=0)
            self.lengths = np.repeat(lengths[:1], self.replicates, axis=0)
        built: dict[tuple, tuple] = {}
        for k in kept:
            j = int(offered[k])
            m = int(move[j, k]) if neighbour[j, k] else -1
            if (j, m) not in built:
                built[j, m] = _neighbour(parents[j], lengths[j], nodes[j], fitted[j], m)
            self.parents[k], self.lengths[k] = built[j, m]
            self.keys[k] = self.key(self.parents[k])
            self.original[k] = own[j] + (gains[j, m // 2, m % 2] if m >= 0 else 0.0)

    def refined(self, rows: np.ndarray, parents, lengths) -> None:
        """Replicates `rows`' trees replaced by their `-bnni` climbs."""
        self.parents[rows], self.lengths[rows] = np.asarray(parents), np.asarray(lengths)
        for r in rows:
            self.keys[r] = self.key(self.parents[r])

    def trees(self, model) -> list[Tree]:
        """Every replicate's tree (unlinked lengths, `[R, M, K]`: their site-weighted mean, as `ml.fit`
        reports a tree)."""
        lengths = self.lengths
        if lengths.ndim == 3:
            lengths = np.average(lengths, axis=2, weights=np.asarray(model.site_counts))
        return TreeBatch(self.parents, lengths, self.taxa).to_trees(rooted=False)

    def split_supports(self) -> dict[frozenset, float]:
        """Percentage of replicates whose kept tree has the split, for every split any kept tree has."""
        found: dict[frozenset, int] = {}
        for key in self.keys:
            for split in key or ():
                found[split] = found.get(split, 0) + 1
        return {split: 100.0 * count / self.replicates for split, count in found.items()}

    def supports(self, tree_splits) -> dict[frozenset, float]:
        """The supports of the given splits (those of the ML tree)."""
        every = self.split_supports()
        return {split: every.get(split, 0.0) for split in tree_splits}

    def settled(self, perturbed: int) -> bool:
        """Whether the search may stop: `max_perturbed` perturbed trees, or, at least `check_every` perturbed
        trees after the previous check, the supports correlate with that check's by `min_correlation`."""
        if perturbed >= self.settings.max_perturbed:
            return True
        if perturbed - self.checked_at < self.settings.check_every and self.checked is not None:
            return False
        now = self.split_supports()
        before, self.checked, self.checked_at = self.checked, now, perturbed
        if before is None:
            return False
        every = sorted(set(now) | set(before), key=sorted)
        x = np.array([before.get(s, 0.0) for s in every])
        y = np.array([now.get(s, 0.0) for s in every])
        if np.std(x) == 0 or np.std(y) == 0:
            return bool(np.array_equal(x, y))
        return float(np.corrcoef(x, y)[0, 1]) >= self.settings.min_correlation

    def state(self) -> dict:
        order = lambda key: None if key is None else tuple(sorted(tuple(sorted(s)) for s in key))  # noqa: E731
        checked = None if self.checked is None else sorted((tuple(sorted(s)), v) for s, v in self.checked.items())
        return {"best": self.best, "original": self.original, "parents": self.parents, "lengths": self.lengths,
                "keys": [order(k) for k in self.keys], "ties": self.ties,
                "rng": self.rng.bit_generator.state,
                "checked": checked, "checked_at": self.checked_at}

    def restore(self, saved: dict) -> None:
        unordered = lambda key: None if key is None else frozenset(map(frozenset, key))  # noqa: E731
        self.best, self.original = saved["best"], saved["original"]
        self.parents, self.lengths = saved["parents"], saved["lengths"]
        self.keys = [unordered(k) for k in saved["keys"]]
        self.ties = saved["ties"]
        self.rng.bit_generator.state = saved["rng"]
        self.checked = None if saved["checked"] is None else {frozenset(s): v for s, v in saved["checked"]}
        self.checked_at = saved["checked_at"]


def _neighbour(parents, lengths, nodes, fitted, move: int):
    """The tree itself (`move` -1) or its NNI neighbour `move = 2 e + j`: `a` (j 0) or `b` (j 1) of edge `e`
    swapped with `s`, the central branch at its fitted length (as `apply_nnis` does)."""
    if move < 0:
        return parents, lengths
    e, j = divmod(move, 2)
    v, u, s, a, b = (int(x) for x in nodes[e])
    p, l = parents.copy(), lengths.copy()
    p[a if j == 0 else b], p[s] = u, v
    l[v] = fitted[e, j]
    return p, l
