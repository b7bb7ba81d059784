"""Automatic model selection on a fixed topology, as IQ-TREE 2's ModelFinder (`-m MF`) does it.

Every candidate (substitution model, frequencies, rate variation) is fitted by
maximum likelihood on one tree (BIONJ of JC69 distances unless given): branch
lengths and all free parameters, frequencies fixed (`+F` empirical, or the
model's own). Candidates are ranked by an information criterion, with `k` the
number of free parameters and `n` the number of alignment sites:

    AIC  = 2k - 2 log L
    AICc = AIC + 2k(k + 1) / (n - k - 1)       (infinite when n <= k + 1)
    BIC  = k ln n - 2 log L

`k` counts, as IQ-TREE 2 does, the 2N - 3 branch lengths of an unrooted tree
of N taxa, the free exchangeability ratios (classes - 1; none for a protein
matrix), the frequencies of `+F` (states - 1: 3 for DNA, 19 for protein) even
though they are counted from the data and not optimised, one parameter each
for `+I` and `+G`, and 2(m - 1) for `+R m`. Akaike weights under a criterion:
`w_i = exp(-D_i / 2) / sum_j exp(-D_j / 2)` with `D_i = IC_i - min_j IC_j`.

Candidate set (IQ-TREE 2.0.7, read from its `.log` with `-m MF`):
DNA: GTR+F, SYM, TVM+F, TVMe, TIM3+F, TIM3e, TIM2+F, TIM2e, TIM+F, TIMe,
TPM3u+F, TPM3+F, TPM2u+F, TPM2+F, K3Pu+F, K3P, TN+F, TNe, HKY+F, K2P, F81+F, JC;
protein: the matrices of `PROTEIN_ORDER` each with and without `+F`; each with
rate variation none, +I, +G4, +I+G4, +R2 ... +R10. Two rules of IQ-TREE 2
(2.0.7's `CandidateModelSet::test`, read there) keep the count down, and are
reproduced here: (1) the +R m of a substitution model (and, apart, its +I+R m)
are fitted for m = 2, 3, ... (-cmin 2, -cmax 10) and stop at the first m whose
criterion is worse (strictly) than at m - 1, that +R m still in the table;
(2) with IQ-TREE's default rate set only (no `mrate`, IQ-TREE's `-mrate AUTO`),
the first substitution model is fitted with every rate type, and the others
only with the rate types whose criterion came within 10 of the best for that
first model. A given `mrate` (e.g. `E,I,G,I+G,R`, or `I+R` for +I+R2 ... +I+R10)
is fitted in full for every substitution model, rule (1) only, as IQ-TREE 2
does with `-mrate`. In IQ-TREE 2.0.7 `TPM2+F` and
`TPM3+F` are TPM2u+F and TPM3u+F (same likelihood): they are listed under both
names here too and fitted once (identical rows).

Speed: all candidates with the same state count and rate type share one
compiled program (the model is data: an exchangeability basis, a mask of free
classes, the frequencies), fitted in batches by `vmap` of the L-BFGS loop of
`fit`; on the CPU batches of one (the C++ kernel runs batch elements in turn,
and a batch waits for its slowest member), on accelerators all at once."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from ...data import Alignment, DNA, distances
from ..._errors import InputError, ModelError
from ...tree import Tree, bionj
from ...likelihood import PRECISIONS, check_inputs, pattern_data
from ...io import PartitionScheme
from ...models import (
    ConstrainedGTR,
    GTR,
    HKY85,
    Model,
    NAMED_DNA_MODELS,
    TN93,
    empirical_frequencies,
    lengths_to_unconstrained,
    parse_model,
    rate_classes,
    split_alignment,
)
from .._fit import MLResult, _tree_lengths
from ._criteria import _criterion, akaike_weights, information_criteria
from ._candidates import Candidate, SCORE_DIFF_THRESHOLD, _DNA_NAMES, _automatic_rates, default_candidates, fit_free_rate_sequences, parse_candidate
from ._batch_fit import MAX_SHAPE, MIN_SHAPE, _Spec, _fit_batch, gamma_category_means, _pad, _padding, _rate_variation, _shape_inverse, _spec




@dataclass
class ModelFit:
    """One row of the table."""

    model: str  # as IQ-TREE names it
    log_likelihood: float
    df: int
    AIC: float
    AICc: float
    BIC: float
    weight: float = 0.0  # Akaike weight under the selection's criterion
    parse_string: str = ""  # the same model for jaxphylo.parse_model
    iterations: int = 0
    params: dict = field(default_factory=dict, repr=False)  # unconstrained, for rebuilding the fitted model


@dataclass
class ModelSelection:
    """Fits of every candidate tested, in the order tested, and the best under `criterion`.

    `best` is the winner's name as IQ-TREE prints it; `best_fit` its fit (an
    `MLResult`: fitted tree and model), whose `model_string` carries every value
    in braces; `best_model` is the winner for `parse_model`/`fit`/`search`
    (values free, e.g. `TPM2u+F+G4`).
    """

    fits: list[ModelFit]
    criterion: str
    best: str
    best_fit: MLResult
    tree: Tree
    num_sites: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # candidates IQ-TREE's rules left out

    @property
    def best_model(self) -> str:
        return next(f.parse_string for f in self.fits if f.model == self.best)

    @property
    def model_string(self) -> str:
        return self.best_fit.model_string

    def ranked(self, criterion: str | None = None) -> list[ModelFit]:
        key = _criterion(criterion or self.criterion)
        return sorted(self.fits, key=lambda f: getattr(f, key))

    def best_under(self, criterion: str) -> str:
        return self.ranked(criterion)[0].model

    def table(self) -> str:
        """The fits, best first, as aligned text."""
        width = max([len(f.model) for f in self.fits] + [5])
        lines = [f"{'model':<{width}}  {'log L':>12}  {'df':>4}  {'AIC':>12}  {'AICc':>12}  {'BIC':>12}  "
                 f"{'w-' + self.criterion:>9}"]
        for f in self.ranked():
            lines.append(f"{f.model:<{width}}  {f.log_likelihood:12.3f}  {f.df:4d}  {f.AIC:12.3f}  {f.AICc:12.3f}  "
                         f"{f.BIC:12.3f}  {f.weight:9.4f}")
        return "\n".join(lines)

    def to_tsv(self, path) -> None:
        """Write the table, best first: model, log_likelihood, df, AIC, AICc, BIC, weight (under the criterion)."""
        with open(path, "w") as handle:
            handle.write(f"model\tlog_likelihood\tdf\tAIC\tAICc\tBIC\tweight_{self.criterion}\n")
            for f in self.ranked():
                handle.write(f"{f.model}\t{f.log_likelihood:.6f}\t{f.df}\t{f.AIC:.6f}\t{f.AICc:.6f}\t{f.BIC:.6f}\t"
                             f"{f.weight:.6g}\n")

    def __str__(self):
        return self.table() + f"\nbest model under {self.criterion}: {self.best}  ({self.model_string})"


def select_part_models(alignment: Alignment, scheme: PartitionScheme, tree: Tree | None = None,
                       **options) -> dict[str, ModelSelection]:
    """ModelFinder for every part of `scheme` (IQ-TREE's `-p FILE -m MF`): each part's candidates fitted by
    `select_model` (same `options`) on one shared topology, by default BIONJ of the whole alignment.

    Returns the selections by part name, in the scheme's order. Parts are
    DNA or protein (the scheme's data type, else the alignment's); model
    selection has no codon candidates, so a codon part is an error naming it.
    """
    kinds = []
    for name, data_type in zip(scheme.names, scheme.data_types):
        data_type = data_type or alignment.alphabet.name
        if data_type not in ("dna", "protein"):
            raise ModelError(f"{scheme.source}: part {name!r} is {data_type} data; model selection tests DNA and "
                             "protein models")
        kinds.append((data_type, 1))
    parts = split_alignment(alignment, scheme, tuple(kinds))
    tree = bionj_start(alignment) if tree is None else tree
    return {name: select_model(part, tree, **options) for name, part in zip(scheme.names, parts)}


def bionj_start(alignment: Alignment) -> Tree:
    """The topology candidates are fitted on without a given tree: BIONJ of JC69 (DNA) or Poisson distances."""
    method = "jc69" if alignment.alphabet == DNA else "poisson"
    return bionj(distances(alignment, method, saturated=10.0), alignment.taxa)


def best_scheme_nexus(scheme: PartitionScheme, selections: dict[str, ModelSelection]) -> str:
    """The scheme with every part's best model, as IQ-TREE's `best_scheme.nex` (a NEXUS `sets` block whose
    `charpartition` names the models; `read_partitions` reads it back)."""
    lines = ["#NEXUS", "begin sets;"]
    for name, ranges in zip(scheme.names, scheme.ranges):
        lines.append(f"  charset {name} = {' '.join(str(r) for r in ranges)};")
    chosen = ", ".join(f"{selections[name].best_model}:{name}" for name in scheme.names)
    lines += [f"  charpartition best = {chosen};", "end;", ""]
    return "\n".join(lines)


class _Selector:
    """Fits candidates in batches, keeping the fitted parameters to start related candidates from."""

    def __init__(self, alignment, tree, criterion, precision, tolerance, max_iterations, batch_size, progress):
        self.alignment, self.tree, self.criterion = alignment, tree, criterion
        self.precision, self.tolerance, self.max_iterations = precision, tolerance, max_iterations
        self.batch_size, self.progress = batch_size, progress
        self.data = pattern_data(alignment, tree)
        self.empirical = np.asarray(empirical_frequencies(alignment))
        self.num_sites, self.num_taxa = alignment.num_sites, len(alignment.taxa)
        self.lengths = np.asarray(lengths_to_unconstrained(jnp.asarray(tree.branch_lengths, float)))
        self.fits: dict[str, ModelFit] = {}  # by name, as IQ-TREE prints it
        self.done: dict[str, ModelFit] = {}  # by parse string: TPM2+F and TPM2u+F are one fit

    def score(self, name: str) -> float:
        return getattr(self.fits[name], self.criterion)

    def _fit_of(self, candidate: Candidate, rate: str):
        """This candidate's substitution model and frequencies, fitted with rate type `rate`, if done."""
        family = candidate.parse_string[: len(candidate.parse_string) - len(candidate.rate)]
        return self.done.get(family + rate)

    def _any_with(self, rate: str):
        """The first fit made with rate type `rate` (of the first substitution model, under IQ-TREE's order)."""
        return next((f for f in self.done.values() if f.parse_string.endswith(rate) and
                     ("+I" in rate) == ("+I" in f.parse_string)), None)

    def _value(self, candidate, rate, key):
        fit = self._fit_of(candidate, rate) or self._any_with(rate)
        return None if fit is None else np.asarray(fit.params[key])

    def _starts(self, candidate: Candidate, spec: _Spec) -> list[dict]:
        """Starting points from the related fits already made (IQ-TREE also starts from them); two where it pays."""
        padding = spec.free_mask.shape[0]
        related = next((f for f in (self._fit_of(candidate, r) for r in (candidate.rate, "+G4", "+I+G4", "+I", ""))
                        if f is not None), None) or self._any_with(candidate.rate)
        lengths = related.params["lengths"] if related is not None else self.lengths
        own = next((f for f in (self._fit_of(candidate, r) for r in ("+G4", "+I+G4", "", "+I")) if f is not None), None)
        exchange = own.params["exchangeabilities"] if own is not None else np.zeros(spec.free.shape[0])
        invariant = self._value(candidate, "+I", "invariant")
        shape = self._value(candidate, "+G4", "gamma")
        base = {"lengths": np.asarray(lengths), "exchangeabilities": np.asarray(exchange),
                "invariant": np.asarray(-1.0 if invariant is None else invariant),
                "gamma": np.asarray(_shape_inverse(1.0) if shape is None else shape),
                "free_weights": np.zeros(padding), "free_rates": np.zeros(padding)}
        if candidate.categories:
            return self._free_rate_starts(candidate, base, padding)
        if "G" in candidate.rate and (shape is None or "+I" in candidate.rate):
            # the likelihood in the shape can have a second optimum near zero (DS1): start from 1 and 0.5
            other = _shape_inverse(0.5) if shape is None else _shape_inverse(1.0)
            return [base, dict(base, gamma=np.asarray(other))]
        return [base]

    def _free_rate_starts(self, candidate, base, padding):
        k = candidate.categories
        prefix = "+I" if candidate.rate.startswith("+I") else ""
        starts = []
        previous = self._fit_of(candidate, f"{prefix}+R{k - 1}")
        if previous is not None:  # split the heaviest category of +R(k-1), as IQ-TREE starts from it
            w = np.exp(previous.params["free_weights"][: k - 1])
            w = w / w.sum()
            r = np.exp(previous.params["free_rates"][: k - 1])
            r = r / np.sum(w * r)
            j = int(np.argmax(w))
            w = np.concatenate([np.delete(w, j), [w[j] / 2, w[j] / 2]])
            r = np.concatenate([np.delete(r, j), [r[j] * 0.7, r[j] * 1.4]])
            order = np.argsort(r)
            starts.append(dict(base, free_weights=_pad(np.log(w[order]), padding),
                               free_rates=_pad(np.log(r[order]), padding)))
        shape = math.exp(math.log(MIN_SHAPE) + (math.log(MAX_SHAPE) - math.log(MIN_SHAPE)) /
                         (1.0 + math.exp(-float(base["gamma"]))))
        rates = np.maximum(gamma_category_means(shape, k), 1e-6)
        starts.append(dict(base, free_rates=_pad(np.log(np.maximum(rates, 1e-3)), padding)))
        return starts

    def fit(self, candidates: list[Candidate]) -> None:
        """Fit `candidates`: every start of every candidate, batched; keep each one's best start."""
        todo = list(dict((c.parse_string, c) for c in candidates if c.parse_string not in self.done).values())
        if todo:
            padding = _padding(todo)
            jobs = []
            for c in todo:
                spec = _spec(c, self.empirical, padding)
                jobs += [(c, spec, start) for start in self._starts(c, spec)]
            size = len(jobs) if self.batch_size is None else self.batch_size
            for i in range(0, len(jobs), size):
                chunk = jobs[i: i + size]
                params = jax.tree.map(lambda *x: jnp.stack([jnp.asarray(v, float) for v in x]), *[j[2] for j in chunk])
                specs = jax.tree.map(lambda *x: jnp.stack(x), *[j[1] for j in chunk])
                fitted, values, iterations = _fit_batch(params, specs, self.tree, self.data, self.precision,
                                                       self.tolerance, self.max_iterations)
                fitted = jax.tree.map(np.asarray, fitted)
                for b, (c, _, _) in enumerate(chunk):
                    log_l = -float(values[b])
                    kept = self.done.get(c.parse_string)
                    if np.isfinite(log_l) and (kept is None or log_l > kept.log_likelihood):
                        self.done[c.parse_string] = ModelFit(
                            c.name, log_l, 0, 0, 0, 0, parse_string=c.parse_string, iterations=int(iterations[b]),
                            params=jax.tree.map(lambda x: x[b], fitted))
        for c in candidates:
            kept = self.done.get(c.parse_string)
            if kept is None:
                raise ModelError(f"model selection: the fit of {c.name} gave no finite log-likelihood")
            row = ModelFit(c.name, kept.log_likelihood, c.df(self.num_taxa), 0, 0, 0, parse_string=c.parse_string,
                           iterations=kept.iterations, params=kept.params)
            for name, value in information_criteria(row.log_likelihood, row.df, self.num_sites).items():
                setattr(row, name, value)
            self.fits[c.name] = row
            if self.progress is not None:
                self.progress(row)

    def fit_with_free_rates(self, candidates: list[Candidate]) -> None:
        """Fit the +R k candidates by IQ-TREE 2's rule (`fit_free_rate_sequences`), batched across families."""
        fit_free_rate_sequences(candidates, self.fit, lambda c: self.score(c.name))


def select_model(
    alignment: Alignment,
    tree: Tree | None = None,
    candidates=None,
    criterion: str = "BIC",
    mset: str | None = None,
    mrate: str | None = None,
    progress=None,
    *,
    batch_size: int | None = -1,
    tolerance: float = 1e-3,
    max_iterations: int = 2000,
    precision: str = "float64",
) -> ModelSelection:
    """Fit every candidate model on one topology and rank them by AIC, AICc and BIC, as IQ-TREE 2's ModelFinder.

    `tree`: the topology (its lengths are starting values; default: BIONJ of
    JC69 distances). `candidates`: model strings (e.g. `["HKY+G4", "GTR+I+G4"]`,
    every one fitted), or None for IQ-TREE 2's `-m MF` set narrowed by `mset`
    (comma list of substitution models, as -mset) and `mrate` (comma list of
    `E, I, G, I+G, R, I+R` or `Rk`, as -mrate), with IQ-TREE's pruning rules
    (module docstring: +R k stops once the criterion worsens; with no `mrate`
    also the rate-type filter after the first model). `criterion` ("AIC",
    "AICc" or "BIC") picks the best and the weights; all three are in the
    table. `progress(row)` is called after each fit. `batch_size`: candidates fitted together (None: all of a rate
    type; -1: 1 on the CPU, all elsewhere).
    """
    start = time.perf_counter()
    criterion = _criterion(criterion)
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    if not isinstance(alignment, Alignment):
        raise InputError(f"select_model needs an Alignment, not {type(alignment).__name__}")
    if len(alignment.taxa) < 3:
        raise InputError(f"{alignment.source}: model selection needs at least 3 taxa, got {len(alignment.taxa)}")
    tree = bionj_start(alignment) if tree is None else tree
    if batch_size == -1:
        batch_size = 1 if jax.default_backend() == "cpu" else None
    if candidates is not None and (mset is not None or mrate is not None):
        raise ModelError("give either candidates or mset/mrate, not both")
    if candidates is not None:
        if isinstance(candidates, str):
            candidates = candidates.split(",")
        chosen = [parse_candidate(c, alignment) for c in candidates]
        if not chosen:
            raise ModelError("candidates: no model given")
        pruning = False
    else:
        chosen = default_candidates(alignment, mset, mrate)
        # IQ-TREE 2 filters rate types only with its default rate set (-mrate AUTO): a given -mrate is fitted in full
        pruning = _automatic_rates(mrate) and any("R" in c.rate for c in chosen)
    check_inputs(alignment, tree, parse_model(chosen[0].parse_string, alignment=alignment))
    selector = _Selector(alignment, tree, criterion, precision, tolerance, max_iterations, batch_size, progress)
    families = list(dict.fromkeys((c.base, c.frequency) for c in chosen))
    if pruning:
        first = [c for c in chosen if (c.base, c.frequency) == families[0]]
        _fit_rate_groups(selector, first)
        scores = [selector.score(c.name) for c in first if c.name in selector.fits]
        allowed = {c.rate for c in first if c.name in selector.fits and
                   selector.score(c.name) <= min(scores) + SCORE_DIFF_THRESHOLD}
        rest = [c for c in chosen if (c.base, c.frequency) != families[0] and c.rate in allowed]
        _fit_rate_groups(selector, rest)
    else:
        _fit_rate_groups(selector, chosen)
    order = {c.name: i for i, c in enumerate(chosen)}
    fits = sorted(selector.fits.values(), key=lambda f: order[f.model])
    weights = akaike_weights([getattr(f, criterion) for f in fits])
    for f, w in zip(fits, weights):
        f.weight = float(w)
    best = min(fits, key=lambda f: (getattr(f, criterion), order[f.model])).model
    best_candidate = next(c for c in chosen if c.name == best)
    return ModelSelection(
        fits=fits, criterion=criterion, best=best,
        best_fit=_result(selector, best_candidate, selector.fits[best]), tree=tree, num_sites=selector.num_sites,
        seconds=time.perf_counter() - start, skipped=[c.name for c in chosen if c.name not in selector.fits],
    )


def _fit_rate_groups(selector: _Selector, candidates: list[Candidate]) -> None:
    """Fixed rate types in IQ-TREE's order (each one batch across models), then the +R sequences."""
    fixed = [r for r in ("", "+I", "+G4", "+I+G4") if any(c.rate == r for c in candidates)]
    for rate in fixed:
        selector.fit([c for c in candidates if c.rate == rate])
    free = [c for c in candidates if "R" in c.rate]
    if free:
        selector.fit_with_free_rates(free)


def _result(selector: _Selector, candidate: Candidate, row: ModelFit) -> MLResult:
    """The fitted tree and a `Model` of jaxphylo's own classes (so `model_string` writes it) for one row."""
    params = {k: jnp.asarray(v) for k, v in row.params.items()}
    spec = _spec(candidate, selector.empirical, len(row.params["free_weights"]))
    template = parse_model(candidate.parse_string, alignment=selector.alignment)
    sub = template.substitution
    if not candidate.protein:
        scale = np.exp(np.where(np.asarray(spec.free) > 0, np.asarray(params["exchangeabilities"]), 0.0))
        classes = rate_classes(NAMED_DNA_MODELS[_DNA_NAMES[candidate.base]][0])
        k = max(classes) + 1
        class_rates = jnp.asarray(scale[:k])
        if isinstance(sub, GTR):
            sub = eqx.tree_at(lambda s: s.rates, sub, class_rates[jnp.asarray(classes)])
        elif isinstance(sub, ConstrainedGTR):
            sub = eqx.tree_at(lambda s: s.class_rates, sub, class_rates)
        elif isinstance(sub, TN93):
            sub = eqx.tree_at(lambda s: (s.kappa_purine, s.kappa_pyrimidine), sub,
                              (class_rates[0] / class_rates[2], class_rates[1] / class_rates[2]))
        elif isinstance(sub, HKY85):
            sub = eqx.tree_at(lambda s: s.kappa, sub, class_rates[0] / class_rates[1])
    model = Model(sub, _rate_variation(candidate, params, spec))
    tree = selector.tree.with_branch_lengths(np.asarray(_tree_lengths(params["lengths"], selector.tree)))
    return MLResult(tree=tree, model=model, log_likelihood=row.log_likelihood, iterations=row.iterations,
                    seconds=0.0)
