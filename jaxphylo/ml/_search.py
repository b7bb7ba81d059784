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
its own branch (NNI central branches, Newton steps), the gains summed."""

from __future__ import annotations

import hashlib
import time
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
    parsimony_tree,
    phase_widths,
    kernel_batch,
    random_topology_tree,
)
from ..likelihood import (
    PRECISIONS, batch_pattern_log_likelihoods, max_step_width, place_data, require_finite, search_data,
    search_lengths, search_template,
)
from ..models import (
    Model, ModelCoordinates, PartitionedModel, model_record,
    resolve_model,
)
from ._fit import MLResult, reported_parameters
from ._lengths import Problem, optimise_lengths, optimise_model_and_lengths
from ._climb import CandidateSet, Climb, SearchSettings, perturb, sorted_splits


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
            blocks.save(run.state)
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
            p, l = perturb(p, l, self.problem_of(self.size), sub, self.settings.perturbation)
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
                "candidates": [(sorted_splits(k), ll, np.asarray(p), np.asarray(l))
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
