"""Maximum-likelihood topology search: many starts and perturbed trees hill-climbed as batches.

The search holds batches of kernel trees on the device (`parents [B, M]`,
`branch_lengths [B, M]`, rooted on tip 0). One round scores every NNI of every
tree from the current partials (`_nni`), applies the best non-conflicting
improving ones, and re-fits all branch lengths by L-BFGS; if that combination
does not improve a tree, the best single NNI is tried instead (IQ-TREE's
rule). A tree is locally optimal when no NNI gains more than `epsilon`; then
the best tree of the batch gets SPR rounds (`_spr`, every regraft within the
radius scored on the device) with RAxML-NG's widening radius.

The regime is IQ-TREE 2's, run as batches: BIONJ and `starts - 1`
randomised stepwise-addition parsimony trees (grown together on the device,
`tree.parsimony_trees`); the model fitted on BIONJ; every start's lengths
under it; the best `top` distinct starts climbed (`width` at a time) to seed
a candidate set of the 5 best distinct trees; then perturbation rounds: each
draws `width` trees from the candidates, applies random independent NNIs to
about half of each one's edges, and climbs them all at once. The stop rule
counts perturbed trees: the search ends after `patience` (IQ-TREE: 100) in a
row found nothing better, so a wide batch ends as soon in trees and sooner in
wall time. The model is re-fitted on the best tree whenever a round raises
it (the candidates re-scored under it), and once more, thoroughly, at the end.

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
from dataclasses import asdict, replace
import jax
import jax.numpy as jnp
import numpy as np
from ..data import Alignment, distances
from ..runtime import NEVER, BlockRun, alignment_digest, device_free_memory, place_batch
from .._errors import InputError
from ..tree import (
    Tree,
    TreeBatch,
    bionj,
    fixed_branches,
    parsimony_trees,
    phase_widths,
    kernel_batch,
    kernel_splits,
    random_topology_tree,
    splits,
)
from ..likelihood import (
    PRECISIONS, batch_pattern_log_likelihoods, max_step_width, node_bytes, place_data, require_finite, search_data,
    search_lengths, search_template,
)
from ..models import (
    Model, ModelCoordinates, PartitionedModel, model_record,
    resolve_model,
)
from ._fit import MLResult, reported_parameters, searched_result
from ._lengths import (
    LENGTHS_BUFFERS, LENGTHS_BYTES, Problem, optimise_lengths, optimise_model_and_lengths, tree_log_likelihoods,
)
from ._climb import CandidateSet, Climb, SearchSettings, perturb, sorted_splits, unsuccessful_trees
from ._ufboot import UFBoot, UFBootSettings


def first_tree(alignment: Alignment, start, seed: int) -> Tree:
    """The first start: the user's tree, BIONJ (default) or a random tree."""
    if isinstance(start, Tree):
        _check_start(alignment, start)
        first = start
    elif start in (None, "bionj"):
        first = bionj(distances(alignment, saturated=5.0), alignment.taxa)
    elif start == "random":
        first = random_topology_tree(alignment.taxa, seed=seed)
    else:
        raise InputError(f"start must be a Tree, 'bionj' or 'random', not {start!r}")
    return first.with_branch_lengths(np.clip(np.asarray(first.branch_lengths, float), 1e-3, 1.0))


def start_batch(alignment: Alignment, start, starts: int, seed: int) -> TreeBatch:
    """`starts` kernel trees: the first (`first_tree`), then randomised stepwise-addition parsimony trees grown
    together on the device (IQ-TREE's and RAxML's starts: diverse and reasonable)."""
    first = kernel_batch([first_tree(alignment, start, seed)])
    if starts == 1:
        return first
    grown, _ = parsimony_trees(alignment, starts - 1, seed=seed)
    return TreeBatch(jnp.concatenate([first.parents, grown.parents.astype(first.parents.dtype)]),
                     jnp.concatenate([first.branch_lengths, grown.branch_lengths.astype(first.branch_lengths.dtype)]),
                     first.taxa)


PROPOSAL_BUFFERS = 4  # partials per node and tree that a round's proposals may need: twice the ~2 measured


def search_width(settings: SearchSettings, template, data, dtype, num_nodes: int) -> int:
    """Trees perturbed and climbed together in a round (`settings.batch` when set).

    On an accelerator, as many as an NNI round's re-fit of twice the batch
    holds in `LENGTHS_BYTES` (32 to 256): the width costs little more time than one tree there.
    On the CPU, where time grows with the trees, `top`: one width for the
    start climb and the perturbation rounds, the fewest programs to compile.
    Either is cut to the trees whose proposals fit in the memory free now (at least one).
    """
    if settings.batch:
        return settings.batch
    partials = (num_nodes + 1) * node_bytes(template, data, dtype)
    # Whatever the rule, no more trees than the memory holds: a perturbation round's proposals keep about two
    # partials per node and tree (1,000 taxa x 9,872 patterns: 151.5 GiB asked for 32 trees, 4.7 GiB a tree,
    # on a 139 GiB H200), so PROPOSAL_BUFFERS per tree of what is free now
    fits = max(1, device_free_memory(jax.devices()[0])[0] // (PROPOSAL_BUFFERS * partials))
    if jax.default_backend() == "cpu":
        return int(min(settings.top, fits))
    wanted = int(np.clip(LENGTHS_BYTES // (2 * LENGTHS_BUFFERS * partials), max(32, settings.top), 256))
    return int(min(wanted, fits))


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


def search(
    alignment: Alignment,
    model: str | Model | PartitionedModel,
    start: Tree | str | None = None,
    *,
    starts: int | None = None,
    seed: int = 0,
    settings: SearchSettings | None = None,
    precision: str = "float64",
    progress=None,
    checkpoint=None,
    resume: bool = False,
    stop=NEVER,
    mesh=None,
    ufboot: int | UFBootSettings = 0,
) -> MLResult:
    """The maximum-likelihood tree: many starts climbed as a batch, perturbation rounds, SPR, a thorough final fit.

    `start`: the first start tree, None or "bionj" (BIONJ on `jp.distances`),
    "random", or a `Tree`; `settings.starts - 1` randomised stepwise-addition
    parsimony trees join it (`starts`, if given, overrides `settings.starts`).
    `progress`, if given, is called with `(round, best log L, candidates, trees, seconds)` after every NNI or
    SPR round (`trees`: start and perturbed trees climbed so far); a resumed
    search first replays its saved rounds with `seconds` None.

    `checkpoint` (a path) saves the search at the end of each stage (start
    fits, first climb, every perturbation round) and whenever it stops: the
    stage, the fitted model, the starts, the candidate trees, the climb in progress, the
    random key and the stop rule's count. With `resume=True` a search continues
    from it and ends as an uninterrupted one would, to the last bit. `stop` (a
    `jaxphylo.runtime._checkpoint.StopRequests`) is read before every NNI or SPR
    round; when it fires the search saves and raises `Interrupted`.

    `mesh` (`jp.device_mesh`) spreads the batch of trees over its `batch`
    axis and the patterns over `patterns` (`jaxphylo.runtime.place_batch`);
    the search is the same, up to the order of sums.

    `ufboot` (replicates, IQ-TREE's `-B`, at least 1,000; or `UFBootSettings`)
    adds ultrafast bootstrap supports (`jaxphylo.ml._ufboot`): every tree the
    NNI rounds score, and each of its NNI neighbours, is RELL-scored under
    every replicate; the perturbation rounds go on, past the stop rule, until
    the supports settle; with `bnni` every replicate's tree is then
    NNI-climbed on its own counts. The result's `ufboot` holds the ML tree's
    supports, `ufboot_trees` every replicate's tree.
    """
    settings = settings or SearchSettings()
    if starts is not None:
        settings = replace(settings, starts=starts)
    record = _search_record(alignment, model, start, seed, settings, precision)
    if isinstance(ufboot, int):
        ufboot = UFBootSettings(ufboot) if ufboot else None
    if ufboot is not None:
        record["ufboot"] = {k: str(v) for k, v in asdict(ufboot).items()}
    blocks = search_checkpoint(checkpoint, record, stop)
    saved = blocks.open(resume)
    run = _SearchRun(alignment, model, start, seed, settings, precision, progress, mesh, ufboot)
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


FINAL_TOLERANCE = 1e-4  # log-likelihood units: the final joint fit of model and lengths (the search's refits: 1e-3)


class _SearchRun:
    """One search as a sequence of short steps, its whole state plain data between them.

    Stages: "start-model" (model and lengths fitted jointly on the first start),
    "start-lengths" (every start's lengths under that model, `width` trees a step),
    "first-climb" (the best distinct starts climbed, `width` a climb, until `top`
    are climbed; they seed the candidate set, and the model is re-fitted on the best),
    "perturb" (draw the next perturbed batch from the candidates, or finish),
    "perturbed-climb" (after a round that raised the best log L the model is re-fitted on the new best
    and the candidates re-scored under it), "final". `advance()` does one step (one NNI or SPR
    round inside a climb) and says whether a stage ended (a moment to save).
    """

    def __init__(self, alignment, model, start, seed, settings, precision, progress, mesh=None, ufboot=None):
        self.settings, self.progress, self.seed, self.mesh = settings, progress, seed, mesh
        self.began = time.perf_counter()
        self.template, self.free = resolve_model(model, alignment)
        self.template = search_template(self.template)
        self.start_trees = start_batch(alignment, start, settings.starts, seed)
        self.taxa = self.start_trees.taxa
        self.data = place_data(search_data(alignment, self.start_trees, self.template), mesh)
        self.dtype = PRECISIONS[precision]
        self.size = search_width(settings, self.template, self.data, self.dtype, self.start_trees.parents.shape[1])
        self.widths = phase_widths(self.start_trees.num_tips, max_step_width(
            self.template, self.data, self.dtype, 2 * self.size, mesh))
        self.model = self.template
        self.candidates = CandidateSet(settings.candidates, self.taxa)
        self.stage, self.climb, self.before = "start-model", None, None
        self.starts, self.chosen, self.done = None, None, 0  # starts' (lengths, log L); the climbed ones; progress
        self.key, self.failures, self.trace, self.trees = jax.random.PRNGKey(seed), 0, [], 0
        self.ufboot = None
        if ufboot is not None:
            self.ufboot = UFBoot(ufboot, np.asarray(self.data.weights), getattr(self.data, "part_of_pattern", None),
                                 seed, self.taxa)

    def problem_of(self, b: int) -> Problem:
        weights = place_batch(jnp.broadcast_to(self.data.weights, (b, self.data.weights.shape[0])), self.mesh)
        return Problem(self.model, self.data, weights, self.widths, self.dtype, self.settings.lengths_method,
                       self.mesh)

    def on_round(self, best: float) -> None:
        self.trace.append((len(self.trace) + 1, best, len(self.candidates.trees), self.trees))
        if self.progress is not None:
            self.progress(*self.trace[-1], time.perf_counter() - self.began)

    def refit(self, p, l, tolerance=1e-3):
        """Model and lengths of one tree re-fitted (IQ-TREE re-optimises the model between search phases)."""
        coordinates = ModelCoordinates(self.model, self.free)
        model, l, ll, values, iterations = optimise_model_and_lengths(p[None], l[None], fixed_branches(p[None]),
                                                                      coordinates, self.problem_of(1), tolerance)
        return model, l[0], float(ll[0]), values, iterations

    def refit_model_on_best(self) -> None:
        """The model re-fitted on the best candidate, then every candidate's lengths under it."""
        _, best_p, best_l = self.candidates.best()
        self.model, _, _, _, _ = self.refit(best_p, best_l)
        p, l = self.candidates.stacked(self.size)
        self.candidates.rescored(*optimise_lengths(p, l, fixed_branches(p), self.problem_of(self.size)))

    def start_rows(self, first: int):
        """Starts `first .. first + width` (the last group padded with the last start), placed on the mesh."""
        rows = np.minimum(np.arange(first, first + self.size), self.settings.starts - 1)
        parents = place_batch(self.start_trees.parents[rows], self.mesh)
        return rows, parents, place_batch(self.starts[0][rows], self.mesh)

    def advance(self) -> bool:
        if self.stage == "start-model":  # lengths and model together on the first start (see `fit`)
            parents = self.start_trees.parents[:1]
            lengths = search_lengths(self.start_trees.branch_lengths, self.template)
            _require_finite_start(tree_log_likelihoods(parents, lengths[:1], self.problem_of(1)), self.problem_of(1),
                                  self.start_trees, lengths[:1])
            self.model, first, log_l, _, _ = self.refit(parents[0], lengths[0])
            self.starts = (np.array(lengths.at[0].set(first)), np.full(self.settings.starts, -np.inf))
            self.starts[1][0] = log_l
            self.stage, self.done = "start-lengths", 1 if self.settings.starts == 1 else 0
            return True
        if self.stage == "start-lengths":
            if self.done < self.settings.starts:
                rows, parents, lengths = self.start_rows(self.done)
                lengths, log_l = optimise_lengths(parents, lengths, fixed_branches(parents), self.problem_of(self.size))
                _require_finite_start(log_l, self.problem_of(self.size), self.start_trees, lengths, rows)
                fresh = np.arange(self.done, self.done + self.size) < self.settings.starts  # not the padding
                self.starts[0][rows[fresh]] = np.asarray(lengths)[fresh]
                self.starts[1][rows[fresh]] = np.asarray(log_l)[fresh]
                self.done += self.size
                self.trees += int(np.sum(fresh))
                return self.done >= self.settings.starts
            self.chosen, self.done = self.best_distinct_starts(), 0
            self.stage = "first-climb"
            return False
        if self.stage == "perturb":
            out_of_time = time.perf_counter() - self.began >= self.settings.max_seconds
            if out_of_time or self.failures >= self.settings.patience and self.supports_settled():
                self.stage, self.done = ("bnni", 0) if self.ufboot is not None and self.ufboot.settings.bnni else ("final", 0)
                return True
            self.key, sub = jax.random.split(self.key)
            self.before = (self.candidates.best()[0], self.candidates.best_key())
            p, l = self.candidates.stacked(self.size)
            p, l = perturb(p, l, self.problem_of(self.size), sub, self.settings.perturbation)
            l, ll = optimise_lengths(p, l, fixed_branches(p), self.problem_of(self.size))
            self.climb, self.stage = Climb(p, l, ll), "perturbed-climb"
            self.trees += self.size
            return False
        if self.stage == "bnni":
            return self.refine_replicates()
        if self.climb is None:  # first climb: the next group of the chosen starts
            rows = self.chosen[self.done: self.done + self.size]
            parents, lengths = self.start_trees.parents[rows], jnp.asarray(self.starts[0][rows])
            self.climb = Climb(place_batch(parents, self.mesh), place_batch(lengths, self.mesh),
                               jnp.asarray(self.starts[1][rows]))
            return False
        if not self.climb.done:
            self.climb.step(self.problem_of, self.settings, self.on_round, self.ufboot)
            return False
        self.candidates.add(*self.climb.result())
        self.climb = None
        if self.stage == "first-climb":
            self.done += self.size
            if self.done < len(self.chosen):
                return True
            self.refit_model_on_best()
        else:
            (before, known), after = self.before, self.candidates.best()[0]
            self.failures = unsuccessful_trees(self.failures, before, after, self.size,
                                               self.candidates.best_key() != known)
            if after > before + self.settings.epsilon:
                self.refit_model_on_best()
        self.stage = "perturb"
        return True

    def supports_settled(self) -> bool:
        """With UFBoot, whether its supports have settled (`UFBoot.settled`; a search without perturbation,
        `--fast`, stops by its own rule)."""
        if self.ufboot is None or self.settings.patience == 0:
            return True
        return self.ufboot.settled(self.trees - self.settings.starts)

    def refine_replicates(self) -> bool:
        """UFBoot2's `-bnni`, one step: the next `width` replicates' trees NNI-climbed on their own counts (the
        search's shapes, so its compiled programs serve), one NNI round a step."""
        rows = np.minimum(np.arange(self.done, self.done + self.size), self.ufboot.replicates - 1)
        weights = place_batch(self.ufboot.device_counts(self.dtype)[rows], self.mesh)
        problem = Problem(self.model, self.data, weights, self.widths, self.dtype, self.settings.lengths_method,
                          self.mesh)
        if self.climb is None:
            parents = place_batch(jnp.asarray(self.ufboot.parents[rows]), self.mesh)
            lengths, log_l = optimise_lengths(parents, place_batch(jnp.asarray(self.ufboot.lengths[rows]), self.mesh),
                                              fixed_branches(parents), problem)
            self.climb = Climb(parents, lengths, log_l, spr=False)
            return False
        if not self.climb.done:
            self.climb.step(lambda _: problem, self.settings)
            return False
        fresh = np.arange(self.done, self.done + self.size) < self.ufboot.replicates
        self.ufboot.refined(rows[fresh], *(np.asarray(x)[fresh] for x in self.climb.batch[:2]))
        self.climb, self.done = None, self.done + self.size
        if self.done >= self.ufboot.replicates:
            self.stage = "final"
        return True

    def best_distinct_starts(self) -> np.ndarray:
        """The best starts by log L, distinct topologies only, `top` of them rounded up to whole climbs of
        `width` (repeating the best ones when there are fewer distinct starts)."""
        seen, rows = set(), []
        for k in np.argsort(-self.starts[1], kind="stable"):
            key = frozenset(x for x in kernel_splits(np.asarray(self.start_trees.parents[k]), self.taxa)
                            if x is not None)
            if key not in seen:
                seen.add(key)
                rows.append(int(k))
        count = self.size * -(-min(self.settings.top, len(rows)) // self.size)
        return np.array([rows[k % len(rows)] for k in range(count)])

    def result(self) -> MLResult:
        _, best_p, best_l = self.candidates.best()
        model, best_l, best_ll, values, iterations = self.refit(best_p, best_l, FINAL_TOLERANCE)
        tree, model = searched_result(best_p, best_l, self.taxa, model)
        supports, trees = None, None
        if self.ufboot is not None:
            supports = self.ufboot.supports(splits(tree))
            trees = self.ufboot.trees(model)
        return MLResult(tree=tree, model=model, log_likelihood=best_ll, iterations=iterations,
                        seconds=time.perf_counter() - self.began, parameters=reported_parameters(values, model),
                        search_rounds=len(self.trace), trace=list(self.trace), ufboot=supports, ufboot_trees=trees)

    def state(self) -> dict:
        """Everything the search needs to go on, as NumPy arrays and Python values (no time: same bytes)."""
        return {"stage": self.stage, "model": [np.asarray(x) for x in jax.tree.leaves(self.model)],
                "starts": self.starts, "chosen": self.chosen, "done": getattr(self, "done", 0),
                "candidates": [(sorted_splits(k), ll, np.asarray(p), np.asarray(l))
                               for k, (ll, p, l) in self.candidates.trees.items()],
                "climb": None if self.climb is None else self.climb.state(), "before": self.before,
                "key": np.asarray(self.key), "failures": self.failures, "trace": list(self.trace),
                "trees": self.trees, "ufboot": None if self.ufboot is None else self.ufboot.state()}

    def restore(self, saved: dict) -> None:
        self.stage, self.before, self.failures = saved["stage"], saved["before"], saved["failures"]
        self.starts, self.chosen, self.done, self.trees = saved["starts"], saved["chosen"], saved["done"], \
            saved["trees"]
        self.model = jax.tree.unflatten(jax.tree.structure(self.template), [jnp.asarray(x) for x in saved["model"]])
        self.candidates.trees = {frozenset(map(frozenset, k)): (ll, jnp.asarray(p), jnp.asarray(l))
                                 for k, ll, p, l in saved["candidates"]}
        self.climb = None if saved["climb"] is None else Climb(**saved["climb"])
        self.key, self.trace = jnp.asarray(saved["key"]), [tuple(x) for x in saved["trace"]]
        if self.ufboot is not None:
            self.ufboot.restore(saved["ufboot"])


def _require_finite_start(log_likelihoods, problem: Problem, batch: TreeBatch, lengths, rows=None) -> None:
    """A start tree whose log-likelihood is not finite stops the search with the cause named (`rows`: the
    starts' numbers of the trees in `log_likelihoods`, default 0, 1, ...)."""
    values = np.asarray(log_likelihoods)
    if np.all(np.isfinite(values)):
        return
    j = int(np.argmax(~np.isfinite(values)))
    k = j if rows is None else int(rows[j])
    parents = batch.parents[k:k + 1]
    per_pattern = batch_pattern_log_likelihoods(problem.model, parents, lengths[j:j + 1], problem.data,
                                                problem.widths, problem.dtype)[0]
    tree = TreeBatch(parents, batch.branch_lengths[k:k + 1], batch.taxa).to_trees(rooted=False)[0]
    require_finite(values[j], model=problem.model, tree=tree, per_pattern=per_pattern,
                   where=f"log-likelihood of start tree {k + 1}")


def _search_record(alignment, model, start, seed, settings, precision) -> dict:
    """What a search's result depends on: a resumed search must match it."""
    data = alignment_digest(alignment)
    if isinstance(start, Tree):
        start = hashlib.sha256(repr((start.taxa, list(start.topology.parent),
                                     np.asarray(start.branch_lengths).tolist())).encode()).hexdigest()
    return {"alignment": data, "model": model_record(model), "start": start, "seed": seed,
            "settings": {k: str(v) for k, v in asdict(settings).items()}, "precision": precision}
