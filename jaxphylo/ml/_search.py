"""Maximum-likelihood topology search: NNI hill climbing on batches of trees, with perturbation.

The search holds a batch of kernel trees on the device (`parents [B, M]`,
`branch_lengths [B, M]`, rooted on tip 0). One round scores every NNI of every
tree from the current partials (`_nni`), applies the best non-conflicting
improving ones, and re-fits all branch lengths by L-BFGS; if that combination
does not improve a tree, the best single NNI is tried instead (IQ-TREE's
rule). A tree is locally optimal when no NNI gains more than `epsilon`.

Escaping local optima is IQ-TREE's stochastic scheme run as a batch: each
perturbation round copies the best tree `batch` times, applies random
independent NNIs to about half of each copy's edges, and hill-climbs all copies
at once; the search stops after `patience` perturbed trees in a row found
nothing better (IQ-TREE: 100, one at a time).

All shapes are fixed by `N`, the pattern count and the batch size, so a whole
search compiles a fixed handful of programs, whatever the number of moves.

A partitioned model searches one topology. With linked lengths (`-p`, `-q`)
the trees carry one set of lengths that every part scales by its rate, and
scores, Newton steps and fits sum over the parts; with unlinked ones (`-Q`)
they carry every part's own, `branch_lengths [B, M, K]`, and each part fits
its own branch (NNI central branches, Newton steps), the gains summed.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..data import Alignment, distances
from ..runtime import NEVER, BlockRun, alignment_digest, place_batch
from .._errors import InputError
from ..tree import (
    Tree,
    TreeBatch,
    bionj,
    fixed_branches,
    kernel_splits,
    mask_like,
    parsimony_tree,
    phase_widths,
    kernel_batch,
    random_topology_tree,
)
from ..likelihood import (
    PRECISIONS, batch_pattern_log_likelihoods, max_step_width, node_bytes, place_data, require_finite, search_data,
    search_lengths, search_template,
)
from ..models import (
    Model, ModelCoordinates, PartitionedModel, lengths_from_unconstrained, lengths_to_unconstrained, model_record,
    resolve_model,
)
from ._fit import MLResult, reported_parameters
from ._newton import newton_lengths
from ._nni import apply_nnis, independent_moves, nni_scores
from ._optimise import minimise
from ._spr import regrafted_tree, spr_scores

SEARCH_TOLERANCE = 0.01  # log-likelihood units over five L-BFGS iterations while searching; 1e-3 for model fits
LENGTHS_BYTES = 16 << 30  # partials that one call of a length optimiser may hold (trees beyond it: more calls)
LENGTHS_BUFFERS = 24  # partials buffers per tree in a length optimiser (Newton: 4 step fractions, derivative passes)


@dataclass
class SearchSettings:
    batch: int = 4  # perturbed copies hill-climbed together
    patience: int = 100  # perturbed trees in a row without improvement before stopping
    perturbation: float = 0.5  # fraction of internal edges a perturbation tries to swap
    epsilon: float = 1e-3  # smallest gain that counts as an improvement
    radius: int = 6  # SPR regraft radius in branches (IQ-TREE's default); 0 turns SPR off
    candidates: int = 5  # best distinct trees kept for perturbation (IQ-TREE's default)
    lengths_method: str = "auto"  # branch-length optimiser during the search: "lbfgs", "newton" or "auto"
    max_seconds: float = float("inf")  # wall-clock limit (makes a search depend on the machine's speed)

    def __post_init__(self):
        for name in ("batch", "candidates"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"search setting {name} must be at least 1, got {getattr(self, name)}")
        for name in ("patience", "radius"):
            if int(getattr(self, name)) < 0:
                raise InputError(f"search setting {name} must not be negative, got {getattr(self, name)}")
        if self.lengths_method not in LENGTHS_METHODS:
            raise InputError(f"lengths_method must be one of {', '.join(LENGTHS_METHODS)}, not {self.lengths_method!r}")
        if not 0 < self.perturbation <= 1:
            raise InputError(f"perturbation must be in (0, 1], got {self.perturbation}")


def _strongly_typed(tree):
    """Floating leaves without JAX's weak type: a parsed model's weak `kappa` and a fitted model's strong one
    would otherwise trace every jitted step of a search twice (one L-BFGS program: ~10 s to compile)."""
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if eqx.is_inexact_array(x) else x, tree)


class Problem(eqx.Module):
    """What every step of a search needs: model, pattern data, per-tree pattern weights, fixed-branch mask.

    A `PartitionedModel` comes with `PartitionedData`: its parts' patterns side by side, the weights too.
    """

    model: Model | PartitionedModel = eqx.field(converter=_strongly_typed)
    data: object  # PatternData, or PartitionedData
    weights: jax.Array  # [B or 1, patterns]
    widths: tuple[int, ...] = eqx.field(static=True)
    dtype: object = eqx.field(static=True)
    lengths_method: str = eqx.field(static=True, default="auto")
    mesh: object = eqx.field(static=True, default=None)  # trees over its `batch` axis (`place_batch`), or None


def _lengths_objective(u, parents, fixed, problem: Problem):
    lengths = jnp.where(mask_like(fixed, u), 0.0, lengths_from_unconstrained(u))
    per = batch_pattern_log_likelihoods(problem.model, parents, lengths, problem.data, problem.widths, problem.dtype)
    return -jnp.sum(problem.weights * per)


def _joint_objective(params, parents, fixed, coordinates: ModelCoordinates, problem: Problem):
    problem = eqx.tree_at(lambda p: p.model, problem, coordinates.model(params["model"]))
    return _lengths_objective(params["lengths"], parents, fixed, problem)


def optimise_model_and_lengths(parents, lengths, fixed, coordinates: ModelCoordinates, problem: Problem,
                               tolerance: float):
    """Re-fit the free model parameters (shared by the batch) and every tree's branch lengths together."""
    fits = [minimise(_joint_objective, {"model": start, "lengths": lengths_to_unconstrained(lengths)},
                     (parents, fixed, coordinates, problem), "lbfgs", tolerance, 2000) for start in coordinates.starts()]
    params, _, iterations = min(fits, key=lambda result: float(result[1]))
    model = coordinates.model(params["model"])
    lengths = jnp.where(mask_like(fixed, lengths), 0.0, lengths_from_unconstrained(params["lengths"]))
    problem = eqx.tree_at(lambda p: p.model, problem, model)
    return model, lengths, tree_log_likelihoods(parents, lengths, problem), coordinates.named_values(params["model"]), \
        int(iterations)


LENGTHS_METHODS = ("auto", "lbfgs", "newton")


def optimise_lengths(parents, lengths, fixed, problem: Problem, tolerance: float = SEARCH_TOLERANCE):
    """Re-fit every free branch length of every tree: `(lengths, log L)`.

    "newton" (`_newton`: per-branch Newton sweeps) or "lbfgs" (an L-BFGS per
    tree); "auto" takes L-BFGS on the CPU, where the C++ kernel makes each of
    its many cheap evaluations fast, and Newton elsewhere, where every pass
    costs a launch latency and Newton needs far fewer passes (see
    benchmarks/results/ml_search-*.json).
    """
    tolerance = jnp.asarray(tolerance, lengths.dtype)  # traced: the start's 1e-3 and the search's 0.01 share a program
    method = problem.lengths_method
    if method == "auto":
        method = "lbfgs" if jax.default_backend() == "cpu" else "newton"
    if method == "newton":
        optimise = lambda *a: newton_lengths(*a, tolerance)[:2]  # noqa: E731
    else:
        optimise = lambda *a: lbfgs_lengths(*a, tolerance)  # noqa: E731
    # Large alignments: trees in groups whose partials fit in LENGTHS_BYTES (the group size depends on the
    # problem only, never on the machine, so a search's result does not either).
    batch = parents.shape[0]
    tree_bytes = LENGTHS_BUFFERS * (parents.shape[1] + 1) * node_bytes(problem.model, problem.data, problem.dtype)
    size = max(1, min(batch, LENGTHS_BYTES // tree_bytes))
    if size == batch:
        return optimise(parents, lengths, fixed, problem)
    results = []
    for start in range(0, batch, size):
        rows = np.minimum(np.arange(start, start + size), batch - 1)  # the last group padded with its last tree
        weights = problem.weights[rows] if problem.weights.shape[0] == batch else problem.weights
        group = eqx.tree_at(lambda p: p.weights, problem, weights)
        results.append(optimise(parents[rows], lengths[rows], fixed[rows], group))
    return tuple(jnp.concatenate(x)[:batch] for x in zip(*results))


@eqx.filter_jit
def lbfgs_lengths(parents, lengths, fixed, problem: Problem, tolerance: float, max_iterations: int = 200):
    """Each tree by its own L-BFGS (vmapped: one program, every tree at once).

    Separate optimisers, not one on the summed log L: a shared line search would
    let the worst-conditioned tree set every tree's step.
    """
    def one_tree(parent, length, fixed, weights):
        alone = eqx.tree_at(lambda p: p.weights, problem, weights[None])
        u, value, _ = minimise(_lengths_objective, lengths_to_unconstrained(length[None]),
                               (parent[None], fixed[None], alone), "lbfgs", tolerance, max_iterations)
        return jnp.where(mask_like(fixed, length), 0.0, lengths_from_unconstrained(u[0])), -value

    return jax.vmap(one_tree)(parents, lengths, fixed, problem.weights)


@eqx.filter_jit
def tree_log_likelihoods(parents, lengths, problem: Problem):
    per = batch_pattern_log_likelihoods(problem.model, parents, lengths, problem.data, problem.widths, problem.dtype)
    return jnp.sum(problem.weights * per, axis=-1)


@eqx.filter_jit
def _propose(parents, lengths, problem: Problem):
    """All chosen improving NNIs of each tree, and the best single one, as two batches of trees."""
    scores = nni_scores(parents, lengths, problem.model, problem.data, problem.weights, problem.widths, problem.dtype)
    which = jnp.argmax(scores.gains, axis=-1)
    gain = jnp.max(scores.gains, axis=-1)
    chosen = independent_moves(gain, scores.nodes, parents.shape[1])
    best = jax.nn.one_hot(jnp.argmax(gain, axis=-1), gain.shape[1], dtype=bool) & (gain > 0)
    return apply_nnis(parents, lengths, scores, chosen, which), apply_nnis(parents, lengths, scores, best, which), \
        jnp.any(chosen, axis=-1)


@eqx.filter_jit
def _perturb(parents, lengths, problem: Problem, key, fraction):
    """Random NNIs on about `fraction` of each tree's internal edges (no two touching the same nodes)."""
    scores = nni_scores(parents, lengths, problem.model, problem.data, problem.weights, problem.widths, problem.dtype)
    k1, k2 = jax.random.split(key)
    draw = jax.random.uniform(k1, scores.valid.shape)
    priority = jnp.where(scores.valid & (draw < fraction), 1.0 + draw, 0.0)
    chosen = independent_moves(priority, scores.nodes, parents.shape[1])
    which = jax.random.bernoulli(k2, 0.5, scores.valid.shape).astype(jnp.int32)
    return apply_nnis(parents, lengths, scores, chosen, which)


def nni_round(parents, lengths, log_likelihoods, fixed, problem: Problem, epsilon: float):
    """One NNI round of every tree: `(parents, lengths, log L, proposed, improved)`.

    `proposed`: some tree had an improving NNI to try; `improved`: some tree
    gained more than `epsilon` after its branch lengths were re-fitted.
    """
    (all_p, all_l), (one_p, one_l), any_move = _propose(parents, lengths, problem)
    if not bool(jnp.any(any_move)):
        return parents, lengths, log_likelihoods, False, False
    candidates_l, candidate_ll = optimise_lengths(jnp.concatenate([all_p, one_p]), jnp.concatenate([all_l, one_l]),
                                                  jnp.concatenate([fixed, fixed]), _doubled(problem))
    b = parents.shape[0]
    options = jnp.stack([log_likelihoods, candidate_ll[:b], candidate_ll[b:]])
    improved = jnp.max(options, axis=0) > log_likelihoods + epsilon
    pick = jnp.where(improved, jnp.argmax(options, axis=0), 0)[None, :, None]
    parents = jnp.take_along_axis(jnp.stack([parents, all_p, one_p]), pick, axis=0)[0]
    lengths = jnp.stack([lengths, candidates_l[:b], candidates_l[b:]])
    lengths = jnp.take_along_axis(lengths, mask_like(pick, lengths), axis=0)[0]
    log_likelihoods = jnp.where(improved, jnp.max(options, axis=0), log_likelihoods)
    return parents, lengths, log_likelihoods, True, bool(jnp.any(improved))


@eqx.filter_jit
def _spr_scores(parent, lengths, problem: Problem, radius: int):
    return spr_scores(parent, lengths, problem.model, problem.data, problem.weights[0], problem.widths, problem.dtype,
                      radius)


def spr_step(parent, lengths, log_likelihood, problem_of, batch: int, settings: SearchSettings):
    """The best SPR of one tree within the radius, if it improves log L: `(parent, lengths, log L, improved)`.

    Every regraft of every pruning is scored on the device with its three new branches fitted (`_spr`); the
    best regraft of each of the `2 * batch` best prunings becomes a tree whose lengths are all re-fitted
    (as many trees as an NNI round re-fits: the same compiled program).
    """
    scores = _spr_scores(parent, lengths, problem_of(1), settings.radius)
    gains = np.asarray(scores.gains)
    top = [j for j in np.argsort(-gains, kind="stable")[:2 * batch] if np.isfinite(gains[j])]
    if not top:
        return parent, lengths, log_likelihood, False
    nodes, fitted = np.asarray(scores.nodes), np.asarray(scores.lengths)
    built = [regrafted_tree(np.asarray(parent), np.asarray(lengths), nodes[j], fitted[j]) for j in top]
    problem = problem_of(2 * batch)
    p, l = (place_batch(_padded(np.stack(x), 2 * batch), problem.mesh) for x in zip(*built))
    l, ll = optimise_lengths(p, l, fixed_branches(p), problem)
    k = int(jnp.argmax(ll))
    if float(ll[k]) > log_likelihood + settings.epsilon:
        return p[k], l[k], float(ll[k]), True
    return parent, lengths, log_likelihood, False


def _padded(x, size):
    """`x` with its first row repeated up to `size` rows (fixed shapes: one compiled program)."""
    return np.concatenate([x, np.repeat(x[:1], size - len(x), axis=0)]) if len(x) < size else x


class Climb:
    """A hill climb in progress, advanced one round per `step()` so that a run can stop and save between any two.

    Phases: "nni", NNI rounds of the whole batch until none improves; then,
    with `spr`, "spr" (the best SPR of the batch's best tree within the
    radius) alternating with "spr-nni" (NNI rounds of copies of the tree that
    SPR made, one compiled shape) while SPR improves; then "done". `result()`
    is the climbed batch with the best tree found moved into slot 0.
    `state()` is plain NumPy, the part of a checkpoint that holds the climb.
    """

    ARRAYS = ("parents", "lengths", "log_likelihoods")

    def __init__(self, parents, lengths, log_likelihoods, spr: bool = True, phase: str = "nni", slot: int = 0,
                 best=None, copies=None):
        self.batch = tuple(jnp.asarray(x) for x in (parents, lengths, log_likelihoods))
        self.spr, self.phase, self.slot = spr, phase, slot
        self.best = None if best is None else (jnp.asarray(best[0]), jnp.asarray(best[1]), float(best[2]))
        self.copies = None if copies is None else tuple(jnp.asarray(x) for x in copies)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def step(self, problem_of, settings: SearchSettings, on_round=None) -> None:
        size = self.batch[0].shape[0]
        if self.phase == "spr":
            p, l, ll, improved = spr_step(*self.best, problem_of, size, settings)
            if improved:
                self.copies = jnp.broadcast_to(p, (size,) + p.shape), jnp.broadcast_to(l, (size,) + l.shape), \
                    jnp.full(size, ll)
            self.phase = "spr-nni" if improved else "done"
            return
        trees = self.batch if self.phase == "nni" else self.copies
        *trees, proposed, improved = nni_round(*trees, fixed_branches(trees[0]), problem_of(size), settings.epsilon)
        if self.phase == "nni":
            self.batch = tuple(trees)
            if proposed and on_round is not None:
                on_round(float(jnp.max(trees[2])))
        else:
            self.copies = tuple(trees)
        if improved:
            return
        if self.phase == "nni":
            self.slot = int(jnp.argmax(trees[2]))
        k = self.slot if self.phase == "nni" else 0
        self.best, self.copies = (trees[0][k], trees[1][k], float(trees[2][k])), None
        if self.phase == "spr-nni" and on_round is not None:
            on_round(self.best[2])
        self.phase = "spr" if self.spr and settings.radius > 0 else "done"

    def result(self):
        """The climbed batch, `(parents, lengths, log L)`, with the best tree found in slot 0."""
        swap = lambda x, y: x.at[self.slot].set(x[0]).at[0].set(y)  # noqa: E731
        return tuple(swap(x, y) for x, y in zip(self.batch, self.best))

    def state(self) -> dict:
        numpy = lambda xs: None if xs is None else tuple(np.asarray(x) for x in xs)  # noqa: E731
        return {"parents": np.asarray(self.batch[0]), "lengths": np.asarray(self.batch[1]),
                "log_likelihoods": np.asarray(self.batch[2]), "spr": self.spr, "phase": self.phase,
                "slot": self.slot, "best": numpy(self.best), "copies": numpy(self.copies)}


class CandidateSet:
    """The best distinct trees found so far (IQ-TREE keeps five), the trees that perturbations start from."""

    def __init__(self, size: int, taxa):
        self.size, self.taxa, self.trees = size, taxa, {}

    def add(self, parents, lengths, log_likelihoods) -> None:
        for p, l, ll in zip(parents, lengths, np.asarray(log_likelihoods)):
            key = frozenset(x for x in kernel_splits(np.asarray(p), self.taxa) if x is not None)
            if key not in self.trees or self.trees[key][0] < ll:
                self.trees[key] = (float(ll), p, l)
        kept = sorted(self.trees.items(), key=lambda item: -item[1][0])[: self.size]
        self.trees = dict(kept)

    def best(self):
        return max(self.trees.values(), key=lambda t: t[0])

    def stacked(self, count: int):
        """`count` trees cycling through the candidates, best first: `(parents, lengths)`."""
        ranked = sorted(self.trees.values(), key=lambda t: -t[0])
        chosen = [ranked[k % len(ranked)] for k in range(count)]
        return jnp.stack([c[1] for c in chosen]), jnp.stack([c[2] for c in chosen])


def _doubled(problem: Problem) -> Problem:
    return eqx.tree_at(lambda p: p.weights, problem, jnp.concatenate([problem.weights, problem.weights]))


def start_trees(alignment: Alignment, start, starts: int, seed: int) -> list[Tree]:
    """`starts` trees: the first BIONJ (default), the user's tree or a random one; the others randomised
    stepwise-addition parsimony trees (IQ-TREE's and RAxML's starts: diverse and reasonable)."""
    if isinstance(start, Tree):
        _check_start(alignment, start)
        first = start
    elif start in (None, "bionj"):
        first = bionj(distances(alignment, saturated=5.0), alignment.taxa)
    elif start == "random":
        first = random_topology_tree(alignment.taxa, seed=seed)
    else:
        raise InputError(f"start must be a Tree, 'bionj' or 'random', not {start!r}")
    trees = [first] + [parsimony_tree(alignment, seed=seed + k) for k in range(1, starts)]
    return [t.with_branch_lengths(np.clip(np.asarray(t.branch_lengths, float), 1e-3, 1.0)) for t in trees]


def check_inputs(alignment: Alignment, model, start=None) -> None:
    """Fail early, in one line, on a model that does not parse or a start tree with other taxa (None: no model)."""
    if model is not None:
        resolve_model(model, alignment)
    if isinstance(start, Tree):
        _check_start(alignment, start)


def _check_start(alignment: Alignment, tree: Tree) -> None:
    if only := sorted(set(tree.taxa) - set(alignment.taxa)):
        raise InputError(f"start tree: taxon {only[0]!r} is not in {alignment.source}")
    if only := sorted(set(alignment.taxa) - set(tree.taxa)):
        raise InputError(f"start tree: taxon {only[0]!r} of {alignment.source} is missing")


def searched_result(parents, lengths, taxa, model) -> tuple[Tree, object]:
    """A kernel tree back as a `Tree` and its model: unlinked lengths go into the model (`[K, nodes]`, the
    tree's node order) and the tree takes their site-weighted mean, as `ml.fit` reports them."""
    tree_of = lambda x: TreeBatch(parents[None], x[None], taxa).to_trees(rooted=False)[0]  # noqa: E731
    if lengths.ndim == 1:
        return tree_of(lengths), model
    own = jnp.stack([tree_of(lengths[:, k]).branch_lengths for k in range(lengths.shape[1])])
    return tree_of(lengths[:, 0]).with_branch_lengths(np.average(own, axis=0, weights=model.site_counts)), \
        model.with_branch_lengths(own)


def search(
    alignment: Alignment,
    model: str | Model | PartitionedModel,
    start: Tree | str | None = None,
    *,
    starts: int = 1,
    seed: int = 0,
    settings: SearchSettings | None = None,
    precision: str = "float64",
    progress=None,
    checkpoint=None,
    resume: bool = False,
    stop=NEVER,
    mesh=None,
) -> MLResult:
    """The maximum-likelihood tree: model fitted on the start tree, NNI hill climbing with perturbation, final fit.

    `start`: None or "bionj" (BIONJ on `jp.distances`), "random", or a `Tree`;
    `starts > 1` adds random trees, all hill-climbed together. `progress`, if
    given, is called with `(round, best log L, seconds)` after every round; a
    resumed search first replays its saved rounds with `seconds` None.

    `checkpoint` (a path) saves the search at the end of each stage (start
    fits, first climb, every perturbation round) and whenever it stops: the
    stage, the fitted model, the candidate trees, the climb in progress, the
    random key and the patience count. With `resume=True` a search continues
    from it and ends as an uninterrupted one would, to the last bit. `stop` (a
    `jaxphylo.runtime._checkpoint.StopRequests`) is read before every NNI or SPR
    round; when it fires the search saves and raises `Interrupted`.

    `mesh` (`jp.device_mesh`) spreads the batch of trees over its `batch`
    axis and the patterns over `patterns` (`jaxphylo.runtime.place_batch`);
    the search is the same, up to the order of sums.
    """
    settings = settings or SearchSettings()
    record = _search_record(alignment, model, start, starts, seed, settings, precision)
    blocks = search_checkpoint(checkpoint, record, stop)
    saved = blocks.open(resume)
    run = _SearchRun(alignment, model, start, starts, seed, settings, precision, progress, mesh)
    if saved is not None:
        run.restore(saved)
        for entry in run.trace if progress is not None else ():
            progress(*entry, None)
    while run.stage != "final":
        blocks.stop_point(run.state, f"after {len(run.trace)} rounds")
        if run.advance():
            blocks.save(run.state())
    return run.result()


def search_checkpoint(checkpoint, record: dict | None = None, stop=NEVER) -> BlockRun:
    """The block run of a search saved at `checkpoint` (`check(resume)` before its log is overwritten)."""
    return BlockRun(checkpoint, record or {}, stop=stop,
                    occupied=f"{checkpoint} holds a saved search: continue it with --resume, start afresh with "
                             f"--redo, or choose another prefix")


class _SearchRun:
    """One search as a sequence of short steps, its whole state plain data between them.

    Stages: "start", "start-model", "start-lengths" (lengths, model, then
    lengths fitted on the start trees), "first-climb", "perturb" (draw the next perturbed batch, or finish),
    "perturbed-climb", "final". `advance()` does one step (one NNI or SPR
    round inside a climb) and says whether a stage ended (a moment to save).
    """

    def __init__(self, alignment, model, start, starts, seed, settings, precision, progress, mesh=None):
        self.settings, self.progress, self.seed, self.mesh = settings, progress, seed, mesh
        self.began = time.perf_counter()
        self.template, self.free = resolve_model(model, alignment)
        self.template = search_template(self.template)
        trees = start_trees(alignment, start, starts, seed)
        self.size = max(settings.batch, starts)
        self.start_batch = kernel_batch(trees + trees[:1] * (self.size - len(trees)))
        self.data = place_data(search_data(alignment, self.start_batch, self.template), mesh)
        self.dtype = PRECISIONS[precision]
        self.widths = phase_widths(self.start_batch.num_tips, max_step_width(
            self.template, self.data, self.dtype, 2 * self.size))
        self.model = self.template
        self.candidates = CandidateSet(settings.candidates, self.start_batch.taxa)
        self.stage, self.climb, self.before = "start", None, None
        self.key, self.failures, self.trace = jax.random.PRNGKey(seed), 0, []

    def problem_of(self, b: int) -> Problem:
        weights = place_batch(jnp.broadcast_to(self.data.weights, (b, self.data.weights.shape[0])), self.mesh)
        return Problem(self.model, self.data, weights, self.widths, self.dtype, self.settings.lengths_method,
                       self.mesh)

    def on_round(self, best: float) -> None:
        self.trace.append((len(self.trace) + 1, best))
        if self.progress is not None:
            self.progress(*self.trace[-1], time.perf_counter() - self.began)

    def refit(self, p, l, tolerance=1e-3):
        """Model and lengths of one tree re-fitted (IQ-TREE re-optimises the model between search phases)."""
        coordinates = ModelCoordinates(self.model, self.free)
        model, l, ll, values, iterations = optimise_model_and_lengths(p[None], l[None], fixed_branches(p[None]),
                                                                      coordinates, self.problem_of(1), tolerance)
        return model, l[0], float(ll[0]), values, iterations

    def refit_model_on_best(self, parents, lengths):  # the model on tree 0, then every tree's lengths under it
        self.model, first, _, _, _ = self.refit(parents[0], lengths[0])
        return optimise_lengths(parents, lengths.at[0].set(first), fixed_branches(parents), self.problem_of(self.size))

    def advance(self) -> bool:
        if self.stage == "start":  # three steps, a stop point between each: each may compile for seconds
            parents = place_batch(self.start_batch.parents, self.mesh)
            lengths = place_batch(search_lengths(self.start_batch.branch_lengths, self.template), self.mesh)
            self.climb = Climb(parents, *optimise_lengths(parents, lengths, fixed_branches(parents),
                                                          self.problem_of(self.size), 1e-3))
            _require_finite_start(self.climb.batch[2], self.problem_of(self.size), self.start_batch, lengths)
            self.stage = "start-model"
            return False
        if self.stage == "start-model":
            # Lengths first, then the model with them (see `fit`), then the lengths of every start under it.
            parents, lengths, _ = self.climb.batch
            self.model, first, _, _, _ = self.refit(parents[0], lengths[0])
            self.climb, self.stage = Climb(parents, lengths.at[0].set(first), self.climb.batch[2]), "start-lengths"
            return False
        if self.stage == "start-lengths":
            parents, lengths, _ = self.climb.batch
            lengths, log_l = optimise_lengths(parents, lengths, fixed_branches(parents), self.problem_of(self.size))
            self.climb, self.stage = Climb(parents, lengths, log_l), "first-climb"
            return True
        if self.stage == "perturb":
            if self.failures >= self.settings.patience or \
                    time.perf_counter() - self.began >= self.settings.max_seconds:
                self.stage = "final"
                return True
            self.key, sub = jax.random.split(self.key)
            self.before = self.candidates.best()[0]
            p, l = self.candidates.stacked(self.size)
            p, l = _perturb(p, l, self.problem_of(self.size), sub, self.settings.perturbation)
            l, ll = optimise_lengths(p, l, fixed_branches(p), self.problem_of(self.size))
            self.climb, self.stage = Climb(p, l, ll), "perturbed-climb"
            return False
        if not self.climb.done:
            self.climb.step(self.problem_of, self.settings, self.on_round)
            return False
        parents, lengths, log_l = self.climb.result()
        if self.stage == "first-climb":
            lengths, log_l = self.refit_model_on_best(parents, lengths)
        self.candidates.add(parents, lengths, log_l)
        if self.stage == "perturbed-climb":
            improved = self.candidates.best()[0] > self.before + self.settings.epsilon
            self.failures = 0 if improved else self.failures + self.size
        self.climb, self.stage = None, "perturb"
        return True

    def result(self) -> MLResult:
        _, best_p, best_l = self.candidates.best()
        model, best_l, best_ll, values, iterations = self.refit(best_p, best_l)
        tree, model = searched_result(best_p, best_l, self.start_batch.taxa, model)
        return MLResult(tree=tree, model=model, log_likelihood=best_ll, iterations=iterations,
                        seconds=time.perf_counter() - self.began, parameters=reported_parameters(values, model),
                        search_rounds=len(self.trace), trace=list(self.trace))

    def state(self) -> dict:
        """Everything the search needs to go on, as NumPy arrays and Python values (no time: same bytes)."""
        return {"stage": self.stage, "model": [np.asarray(x) for x in jax.tree.leaves(self.model)],
                "candidates": [(_sorted_splits(k), ll, np.asarray(p), np.asarray(l))
                               for k, (ll, p, l) in self.candidates.trees.items()],
                "climb": None if self.climb is None else self.climb.state(), "before": self.before,
                "key": np.asarray(self.key), "failures": self.failures, "trace": list(self.trace)}

    def restore(self, saved: dict) -> None:
        self.stage, self.before, self.failures = saved["stage"], saved["before"], saved["failures"]
        self.model = jax.tree.unflatten(jax.tree.structure(self.template), [jnp.asarray(x) for x in saved["model"]])
        self.candidates.trees = {frozenset(map(frozenset, k)): (ll, jnp.asarray(p), jnp.asarray(l))
                                 for k, ll, p, l in saved["candidates"]}
        self.climb = None if saved["climb"] is None else Climb(**saved["climb"])
        self.key, self.trace = jnp.asarray(saved["key"]), list(saved["trace"])


def _sorted_splits(key: frozenset) -> tuple:
    """A tree's split set in a fixed order: a set's pickle follows its iteration order, which can differ
    between equal sets (insertion history), and a checkpoint must repeat byte for byte."""
    return tuple(sorted(tuple(sorted(split)) for split in key))


def _require_finite_start(log_likelihoods, problem: Problem, batch: TreeBatch, lengths) -> None:
    """A start tree whose log-likelihood is not finite stops the search with the cause named."""
    values = np.asarray(log_likelihoods)
    if np.all(np.isfinite(values)):
        return
    k = int(np.argmax(~np.isfinite(values)))
    per_pattern = batch_pattern_log_likelihoods(problem.model, batch.parents, lengths, problem.data,
                                                 problem.widths, problem.dtype)[k]
    tree = TreeBatch(batch.parents[k:k + 1], batch.branch_lengths[k:k + 1], batch.taxa).to_trees(rooted=False)[0]
    require_finite(values[k], model=problem.model, tree=tree, per_pattern=per_pattern,
                   where=f"log-likelihood of start tree {k + 1}")


def _search_record(alignment, model, start, starts, seed, settings, precision) -> dict:
    """What a search's result depends on: a resumed search must match it."""
    from dataclasses import asdict

    data = alignment_digest(alignment)
    if isinstance(start, Tree):
        start = hashlib.sha256(repr((start.taxa, list(start.topology.parent),
                                     np.asarray(start.branch_lengths).tolist())).encode()).hexdigest()
    return {"alignment": data, "model": model_record(model), "start": start, "starts": starts, "seed": seed,
            "settings": {k: str(v) for k, v in asdict(settings).items()}, "precision": precision}
