"""Hill climbing of a batch of trees: NNI rounds (every tree's independent improving NNIs at once), SPR
rounds within a radius, perturbation, the candidate set of best distinct trees, and the search settings."""

from __future__ import annotations

from dataclasses import dataclass
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from ..runtime import place_batch
from .._errors import InputError
from ..models import MIN_LENGTH
from ..tree import (
    fixed_branches,
    kernel_splits,
    mask_like,
)
from ._nni import apply_nnis, independent_moves, nni_scores
from ._spr import regrafted_tree, spr_scores
from ._lengths import LENGTHS_METHODS, Problem, optimise_lengths


@dataclass
class SearchSettings:
    """How a search runs. The defaults are IQ-TREE 2's regime (`-ninit 100 -ntop 20`, a candidate set of 5,
    100 unsuccessful perturbed trees) with RAxML-NG's SPR radius schedule; `fast()` is one start, NNI and
    SPR at the first radius (RAxML-NG's `--fast`, FastTree's regime)."""

    starts: int = 100  # start trees: BIONJ (or the given tree) and randomised stepwise-addition parsimony trees
    top: int = 20  # best distinct starts NNI-climbed to seed the candidate set (more where a batch holds more)
    batch: int = 0  # trees perturbed and climbed together in a round; 0: `search_width` chooses
    patience: int = 100  # perturbed trees in a row without improvement before stopping
    perturbation: float = 0.5  # fraction of internal edges a perturbation tries to swap
    epsilon: float = 1e-3  # smallest gain for which a climb takes an NNI or SPR move, and the model is re-fitted
    radius: int = 5  # first SPR regraft radius in branches; 0 turns SPR off
    max_radius: int | None = None  # a cap on the widening radius (None: none; RAxML-NG's 5, 10, 15, ...)
    spr_rounds: int = 0  # SPR moves a climb applies at most (0: until none gains)
    candidates: int = 5  # best distinct trees kept for perturbation (IQ-TREE's default)
    lengths_method: str = "auto"  # branch-length optimiser during the search: "lbfgs", "newton" or "auto"
    max_seconds: float = float("inf")  # wall-clock limit (makes a search depend on the machine's speed)

    def __post_init__(self):
        for name in ("starts", "top", "candidates"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"search setting {name} must be at least 1, got {getattr(self, name)}")
        for name in ("batch", "patience", "radius", "max_radius", "spr_rounds"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 0:
                raise InputError(f"search setting {name} must not be negative, got {getattr(self, name)}")
        if self.lengths_method not in LENGTHS_METHODS:
            raise InputError(f"lengths_method must be one of {', '.join(LENGTHS_METHODS)}, not {self.lengths_method!r}")
        if not 0 < self.perturbation <= 1:
            raise InputError(f"perturbation must be in (0, 1], got {self.perturbation}")

    @classmethod
    def fast(cls, **changes) -> "SearchSettings":
        """One start (BIONJ), NNI rounds, then SPR at the first radius only while it gains, no perturbation.
        (One SPR move alone, `spr_rounds=1`, ended 6.9 log L below FastTree on DS1.)"""
        return cls(**{"starts": 1, "top": 1, "batch": 1, "patience": 0, "max_radius": 5, **changes})


def unsuccessful_trees(failures: int, before: float, after: float, trees: int, new_best: bool) -> int:
    """The stop rule's count after a round that perturbed and climbed `trees` trees: perturbed trees since a
    round last found a new best tree. IQ-TREE's rule (`addTreeToCandidateSet`): a round succeeds when its best
    is a tree the candidate set did not hold (`new_best`: distinct as `CandidateSet` counts trees) with a log L
    above the best before it, by any amount; a known tree re-fitted higher is no success. IQ-TREE counts one
    perturbed tree at a time and stops at 100; a batch counts every tree, so a wide batch ends as soon in
    trees, and sooner in wall time. (Measured: the same results as the 1e-3 threshold used before on DS1-DS3,
    and on dengue352 the same 58 rounds: its last rounds raised the best by a few 1e-4 with other resolutions
    of the same tree's zero-length branches.)"""
    return 0 if new_best and after > before else failures + trees


@eqx.filter_jit
def _propose(parents, lengths, problem: Problem, rell=None, floor=None):
    """All chosen improving NNIs of each tree, and the best single one, as two batches of trees; and the
    scores, which with `rell` (UFBoot's replicate counts) hold every tree's and neighbour's RELL values
    (neighbours with log L below `floor` left out)."""
    scores = nni_scores(parents, lengths, problem.model, problem.data, problem.weights, problem.widths, problem.dtype,
                        rell=rell, rell_floor=floor)
    which = jnp.argmax(scores.gains, axis=-1)
    gain = jnp.max(scores.gains, axis=-1)
    chosen = independent_moves(gain, scores.nodes, parents.shape[1])
    best = jax.nn.one_hot(jnp.argmax(gain, axis=-1), gain.shape[1], dtype=bool) & (gain > 0)
    return apply_nnis(parents, lengths, scores, chosen, which), apply_nnis(parents, lengths, scores, best, which), \
        jnp.any(chosen, axis=-1), scores if rell is not None else None


PERTURBATION_PASSES = 2  # one pass of node-disjoint NNIs holds about a quarter of a tree's internal edges


@eqx.filter_jit
def perturb(parents, lengths, problem: Problem, key, fraction):
    """Random NNIs on `fraction` of each tree's internal edges: IQ-TREE's count, `floor(fraction (n - 3))`
    (at least one). IQ-TREE applies them one after another, each on a random edge of the tree the last one
    made; here in `PERTURBATION_PASSES` passes, each a random set of edges whose quartets share no node,
    scored and applied on the tree the pass before made, until the count is reached."""
    remaining = None
    for key in jax.random.split(key, PERTURBATION_PASSES):
        scores = nni_scores(parents, lengths, problem.model, problem.data, problem.weights, problem.widths,
                            problem.dtype)
        if remaining is None:
            remaining = jnp.maximum(jnp.floor(fraction * jnp.sum(scores.valid, axis=-1)), 1.0)
        k1, k2 = jax.random.split(key)
        priority = jnp.where(scores.valid, 1.0 + jax.random.uniform(k1, scores.valid.shape), 0.0)
        chosen = independent_moves(priority, scores.nodes, parents.shape[1])
        order = jnp.argsort(-priority, axis=-1)
        taken = jnp.take_along_axis(chosen, order, axis=-1)
        kept = taken & (jnp.cumsum(taken, axis=-1) <= remaining[:, None])  # the first `remaining`, by priority
        chosen = jax.vmap(lambda o, k: jnp.zeros_like(k).at[o].set(k))(order, kept)
        remaining = remaining - jnp.sum(chosen, axis=-1)
        which = jax.random.bernoulli(k2, 0.5, scores.valid.shape).astype(jnp.int32)
        parents, lengths = apply_nnis(parents, lengths, scores, chosen, which)
    return parents, lengths


def nni_round(parents, lengths, log_likelihoods, fixed, problem: Problem, epsilon: float, ufboot=None):
    """One NNI round of every tree: `(parents, lengths, log L, proposed, improved)`.

    `proposed`: some tree had an improving NNI to try; `improved`: some tree
    gained more than `epsilon` after its branch lengths were re-fitted.
    `ufboot` (`UFBoot`), if given, sees every tree and every NNI neighbour scored.
    """
    rell, floor = (None, None) if ufboot is None else (ufboot.device_counts(problem.dtype), ufboot.floor(problem.dtype))
    (all_p, all_l), (one_p, one_l), any_move, scores = _propose(parents, lengths, problem, rell, floor)
    if ufboot is not None:
        ufboot.observe(parents, lengths, scores)
    if not bool(jnp.any(any_move)):
        return parents, lengths, log_likelihoods, False, False
    candidates_l, candidate_ll = optimise_lengths(*_stacked_candidates(all_p, one_p, all_l, one_l, fixed),
                                                  _doubled(problem))
    parents, lengths, log_likelihoods, improved = _best_of_three(parents, lengths, log_likelihoods, all_p, one_p,
                                                                 candidates_l, candidate_ll, epsilon)
    return parents, lengths, log_likelihoods, True, bool(improved)


@jax.jit
def _stacked_candidates(all_p, one_p, all_l, one_l, fixed):
    """The round's two candidate batches stacked into one (one re-fit of `2 B` trees)."""
    return (jnp.concatenate([all_p, one_p]), jnp.concatenate([all_l, one_l]), jnp.concatenate([fixed, fixed]))


@jax.jit
def _best_of_three(parents, lengths, log_likelihoods, all_p, one_p, candidates_l, candidate_ll, epsilon):
    """Every tree's best of itself, its all-NNI and its one-NNI neighbour (`epsilon` traced: one program);
    returns `(parents, lengths, log L, whether any tree gained more than epsilon)`."""
    b = parents.shape[0]
    options = jnp.stack([log_likelihoods, candidate_ll[:b], candidate_ll[b:]])
    improved = jnp.max(options, axis=0) > log_likelihoods + epsilon
    pick = jnp.where(improved, jnp.argmax(options, axis=0), 0)[None, :, None]
    parents = jnp.take_along_axis(jnp.stack([parents, all_p, one_p]), pick, axis=0)[0]
    lengths = jnp.stack([lengths, candidates_l[:b], candidates_l[b:]])
    lengths = jnp.take_along_axis(lengths, mask_like(pick, lengths), axis=0)[0]
    return parents, lengths, jnp.where(improved, jnp.max(options, axis=0), log_likelihoods), jnp.any(improved)


@eqx.filter_jit
def _spr_scores(parent, lengths, problem: Problem, radius: int):  # one program per radius
    return spr_scores(parent, lengths, problem.model, problem.data, problem.weights[0], problem.widths, problem.dtype,
                      radius)


def spr_step(parent, lengths, log_likelihood, problem_of, batch: int, settings: SearchSettings, radius: int):
    """The best SPRs of one tree within the radius: `(parents, lengths, log L, improved)`, `batch` trees.

    Every regraft of every pruning is scored on the device with its three new branches fitted (`_spr`); the
    best regraft of each of the `2 * batch` best prunings becomes a tree whose lengths are all re-fitted
    (as many trees as an NNI round re-fits: the same compiled program). The `batch` best of them, best
    first, go on to be NNI-climbed together (each a different neighbourhood, none a copy); `improved`: the
    best gained more than `epsilon`.
    """
    scores = _spr_scores(parent, lengths, problem_of(1), radius)
    gains = np.asarray(scores.gains)
    top = [j for j in np.argsort(-gains, kind="stable")[:2 * batch] if np.isfinite(gains[j])]
    if not top:
        return None, None, None, False
    nodes, fitted = np.asarray(scores.nodes), np.asarray(scores.lengths)
    built = [regrafted_tree(np.asarray(parent), np.asarray(lengths), nodes[j], fitted[j]) for j in top]
    problem = problem_of(2 * batch)
    p, l = (place_batch(_padded(np.stack(x), 2 * batch), problem.mesh) for x in zip(*built))
    l, ll = optimise_lengths(p, l, fixed_branches(p), problem)
    best = np.argsort(-np.asarray(ll), kind="stable")[:batch]
    improved = float(ll[best[0]]) > log_likelihood + settings.epsilon
    return p[best], l[best], ll[best], improved


def _padded(x, size):
    """`x` with its first row repeated up to `size` rows (fixed shapes: one compiled program)."""
    return np.concatenate([x, np.repeat(x[:1], size - len(x), axis=0)]) if len(x) < size else x


class Climb:
    """A hill climb in progress, advanced one round per `step()` so that a run can stop and save between any two.

    Phases: "nni", NNI rounds of the whole batch until none improves; then,
    with `spr`, "spr" (the best SPRs of the batch's best tree within the
    radius) alternating with "spr-nni" (NNI rounds of the batch's width of the
    best trees SPR made, one compiled shape) while SPR improves; when it does not, the
    radius widens by 5 (RAxML-NG's schedule: 5, 10, 15, ...) if it is the first
    radius or the radius made a move, so the climb ends when a widened radius
    finds nothing (or past `max_radius`, the tree's node count, or `spr_rounds`
    SPR moves); then "done". `result()` is the climbed batch with the best tree found moved into
    slot 0. `state()` is plain NumPy, the part of a checkpoint that holds the climb.
    """

    ARRAYS = ("parents", "lengths", "log_likelihoods")

    def __init__(self, parents, lengths, log_likelihoods, spr: bool = True, phase: str = "nni", slot: int = 0,
                 best=None, copies=None, radius: int = 0, moves: int = 0, gained: bool = False):
        self.batch = tuple(jnp.asarray(x) for x in (parents, lengths, log_likelihoods))
        self.spr, self.phase, self.slot, self.radius, self.moves = spr, phase, slot, radius, moves
        self.gained = gained  # the radius made an SPR move since it was set: then a wider one is tried
        self.best = None if best is None else (jnp.asarray(best[0]), jnp.asarray(best[1]), float(best[2]))
        self.copies = None if copies is None else tuple(jnp.asarray(x) for x in copies)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def step(self, problem_of, settings: SearchSettings, on_round=None, ufboot=None) -> None:
        size = self.batch[0].shape[0]
        if self.phase == "spr":
            p, l, ll, improved = spr_step(*self.best, problem_of, size, settings, self.radius)
            nodes = self.best[0].shape[-1]  # no regraft path is longer
            cap = nodes if settings.max_radius is None else min(settings.max_radius, nodes)
            if improved:
                self.moves += 1
                self.copies, self.phase, self.gained = (p, l, ll), "spr-nni", True
            elif (self.gained or self.radius == settings.radius) and self.radius + 5 <= cap and not settings.spr_rounds:
                self.radius, self.gained = self.radius + 5, False
            else:
                self.phase = "done"
            return
        trees = self.batch if self.phase == "nni" else self.copies
        *trees, proposed, improved = nni_round(*trees, fixed_branches(trees[0]), problem_of(size), settings.epsilon,
                                               ufboot)
        if self.phase == "nni":
            self.batch = tuple(trees)
            if proposed and on_round is not None:
                on_round(float(jnp.max(trees[2])))
        else:
            self.copies = tuple(trees)
        if improved:
            return
        k = int(jnp.argmax(trees[2]))
        if self.phase == "nni":
            self.slot = k
        if self.phase == "nni" or float(trees[2][k]) > self.best[2]:
            self.best = trees[0][k], trees[1][k], float(trees[2][k])
        self.copies = None
        if self.phase == "spr-nni" and on_round is not None:
            on_round(self.best[2])
        more = not settings.spr_rounds or self.moves < settings.spr_rounds
        if self.phase == "nni":
            self.radius, self.gained = settings.radius, False
        self.phase = "spr" if self.spr and settings.radius > 0 and more else "done"

    def result(self):
        """The climbed batch, `(parents, lengths, log L)`, with the best tree found in slot 0."""
        swap = lambda x, y: x.at[self.slot].set(x[0]).at[0].set(y)  # noqa: E731
        return tuple(swap(x, y) for x, y in zip(self.batch, self.best))

    def state(self) -> dict:
        numpy = lambda xs: None if xs is None else tuple(np.asarray(x) for x in xs)  # noqa: E731
        return {"parents": np.asarray(self.batch[0]), "lengths": np.asarray(self.batch[1]),
                "log_likelihoods": np.asarray(self.batch[2]), "spr": self.spr, "phase": self.phase,
                "slot": self.slot, "best": numpy(self.best), "copies": numpy(self.copies), "radius": self.radius,
                "moves": self.moves, "gained": self.gained}


DISTINCT_LENGTH = 10 * MIN_LENGTH  # a branch no longer than this is a zero-length resolution of a polytomy


def resolved_splits(parent, lengths, taxa) -> frozenset:
    """A kernel tree's splits on branches longer than `DISTINCT_LENGTH` (every part's, with unlinked lengths):
    two trees that differ only in how zero-length branches resolve a polytomy are one multifurcating tree."""
    lengths = np.asarray(lengths).reshape(len(parent), -1).max(axis=1)
    return frozenset(x for x, t in zip(kernel_splits(np.asarray(parent), taxa), lengths)
                     if x is not None and t > DISTINCT_LENGTH)


class CandidateSet:
    """The best distinct trees found so far (IQ-TREE keeps five), the trees that perturbations start from.

    Distinct means distinct once zero-length branches are collapsed (`resolved_splits`): on data with
    identical or near-identical sequences a climb ends in many resolutions of the same polytomies, a few
    thousandths of a log-likelihood unit apart, and counted as different trees they filled all five places
    (dengue352: the five candidates of the last rounds were one tree), so that every perturbation started
    from the same optimum. The best resolution stands for the tree."""

    def __init__(self, size: int, taxa):
        self.size, self.taxa, self.trees = size, taxa, {}

    def add(self, parents, lengths, log_likelihoods) -> None:
        for p, l, ll in zip(parents, lengths, np.asarray(log_likelihoods)):
            key = resolved_splits(p, l, self.taxa)
            if key not in self.trees or self.trees[key][0] < ll:
                self.trees[key] = (float(ll), p, l)
        kept = sorted(self.trees.items(), key=lambda item: -item[1][0])[: self.size]
        self.trees = dict(kept)

    def best(self):
        return max(self.trees.values(), key=lambda t: t[0])

    def best_key(self) -> tuple:
        """The best tree's splits (`resolved_splits`) in a fixed order (`sorted_splits`): what a round compares
        to tell a new best tree from a known one, and a checkpoint holds."""
        return sorted_splits(max(self.trees, key=lambda k: self.trees[k][0]))

    def rescored(self, lengths, log_likelihoods) -> None:
        """The candidates (in `stacked` order) with lengths re-fitted under a new model."""
        ranked = sorted(self.trees.values(), key=lambda t: -t[0])
        self.trees = {}
        self.add(jnp.stack([ranked[k % len(ranked)][1] for k in range(len(lengths))]), lengths, log_likelihoods)

    def stacked(self, count: int):
        """`count` trees cycling through the candidates, best first: `(parents, lengths)`."""
        ranked = sorted(self.trees.values(), key=lambda t: -t[0])
        chosen = [ranked[k % len(ranked)] for k in range(count)]
        return jnp.stack([c[1] for c in chosen]), jnp.stack([c[2] for c in chosen])


def _doubled(problem: Problem) -> Problem:
    return eqx.tree_at(lambda p: p.weights, problem, jnp.concatenate([problem.weights, problem.weights]))


def sorted_splits(key: frozenset) -> tuple:
    """A tree's split set in a fixed order: a set's pickle follows its iteration order, which can differ
    between equal sets (insertion history), and a checkpoint must repeat byte for byte."""
    return tuple(sorted(tuple(sorted(split)) for split in key))
