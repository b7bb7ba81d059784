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
and a batch waits for its slowest member), on accelerators all at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from ..data import Alignment, DNA, PROTEIN, distances
from .._errors import InputError, ModelError
from ..tree import Tree, bionj
from ..likelihood import PRECISIONS, check_inputs, data_log_likelihood, pattern_data
from ..io import PartitionScheme
from ..models import (
    ConstrainedGTR,
    canonical_name,
    DiscreteGamma,
    EMPIRICAL_MODELS,
    FreeRates,
    GTR,
    HKY85,
    InvariantSites,
    Model,
    NAMED_DNA_MODELS,
    RateVariation,
    SubstitutionModel,
    TN93,
    UniformRates,
    discrete_gamma_rates,
    empirical_frequencies,
    empirical_matrix,
    lengths_to_unconstrained,
    parse_model,
    rate_classes,
    split_alignment,
)
from ._fit import MLResult, _tree_lengths
from ._optimise import minimise

CRITERIA = ("AIC", "AICc", "BIC")
SCORE_DIFF_THRESHOLD = 10.0  # IQ-TREE 2's score_diff_thres: rate types kept after the first model
MIN_SHAPE, MAX_SHAPE = 0.02, 1000.0  # IQ-TREE's bounds on the Gamma shape
MAX_INVARIANT = 0.999
FREE_RATE_RANGE = (2, 10)  # IQ-TREE's -cmin / -cmax

# IQ-TREE name -> (our name for parse_model and rate classes, frequencies: "F" free-frequency model or "equal")
DNA_ORDER = ("GTR", "SYM", "TVM", "TVMe", "TIM3", "TIM3e", "TIM2", "TIM2e", "TIM", "TIMe", "TPM3u", "TPM3", "TPM2u",
             "TPM2", "K3Pu", "K3P", "TN", "TNe", "HKY", "K2P", "F81", "JC")
_DNA_NAMES = {
    "GTR": "GTR", "SYM": "SYM", "TVM": "TVM", "TVMe": "TVMe", "TIM3": "TIM3", "TIM3e": "TIM3e", "TIM2": "TIM2",
    "TIM2e": "TIM2e", "TIM": "TIM", "TIMe": "TIMe", "TPM3u": "TPM3u", "TPM3": "TPM3u", "TPM2u": "TPM2u",
    "TPM2": "TPM2u", "K3Pu": "K3Pu", "K3P": "K3P", "TN": "TN93", "TNe": "TNe", "HKY": "HKY85", "K2P": "K80",
    "F81": "F81", "JC": "JC69",
}
_EQUAL_IN_IQTREE = {"SYM", "TVMe", "TIM3e", "TIM2e", "TIMe", "K3P", "TNe", "K2P", "JC"}
_DNA_SHOWN = {canonical_name(name): name for name in DNA_ORDER}  # a model's name as IQ-TREE's ModelFinder shows it
# IQ-TREE 2.0.7's default protein list, in its order (its `-m MF` log); `--mset` may name any of EMPIRICAL_MODELS.
PROTEIN_ORDER = ("LG", "WAG", "JTT", "JTTDCMut", "DCMut", "VT", "PMB", "Blosum62", "Dayhoff", "mtREV", "mtART",
                 "mtZOA", "mtMet", "mtVer", "mtInv", "mtMAM", "HIVb", "HIVw", "FLU", "rtREV", "cpREV")
_RATE_ALIASES = {"E": "", "I": "+I", "G": "+G4", "G4": "+G4", "I+G": "+I+G4", "I+G4": "+I+G4"}
_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


# ----------------------------------------------------------------------------------------- criteria


def information_criteria(log_likelihood: float, df: int, num_sites: int) -> dict:
    """`{"AIC", "AICc", "BIC"}` of a fit: AIC = 2k - 2 log L, AICc = AIC + 2k(k+1)/(n-k-1), BIC = k ln n - 2 log L."""
    k, n = df, num_sites
    aic = 2.0 * k - 2.0 * log_likelihood
    aicc = aic + 2.0 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf
    return {"AIC": aic, "AICc": aicc, "BIC": k * math.log(n) - 2.0 * log_likelihood}


def akaike_weights(scores) -> np.ndarray:
    """`exp(-D_i / 2) / sum_j exp(-D_j / 2)`, `D_i = score_i - min score` (0 for infinite scores)."""
    scores = np.asarray(scores, float)
    finite = np.isfinite(scores)
    if not finite.any():
        return np.full(len(scores), 1.0 / len(scores)) if len(scores) else scores
    relative = np.where(finite, np.exp(-0.5 * (scores - scores[finite].min())), 0.0)
    return relative / relative.sum()


# ----------------------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidate:
    """One model to fit: `name` as IQ-TREE prints it (e.g. `TPM2+F+G4`), its parts, and the free-parameter count."""

    name: str
    base: str  # IQ-TREE's substitution name (or a protein matrix)
    frequency: str  # "+F" or ""
    rate: str  # "", "+I", "+G4", "+I+G4", "+R3", "+I+R3"

    @property
    def protein(self) -> bool:
        return self.base in EMPIRICAL_MODELS

    @property
    def parse_string(self) -> str:
        """The same model as `jaxphylo.parse_model` reads it (TPM2+F is TPM2u+F, HKY is HKY85...)."""
        base = self.base if self.protein else _DNA_NAMES[self.base]
        return base + self.frequency + self.rate

    @property
    def categories(self) -> int:
        """Free-rate categories (0 unless +R)."""
        return int(self.rate.split("R")[1]) if "R" in self.rate else 0

    def substitution_parameters(self) -> int:
        if self.protein:
            return 0
        return max(rate_classes(NAMED_DNA_MODELS[_DNA_NAMES[self.base]][0])) + 1 - 1

    def frequency_parameters(self) -> int:
        return (19 if self.protein else 3) if self.frequency else 0

    def rate_parameters(self) -> int:
        k = self.categories
        return ("+I" in self.rate) + ("G" in self.rate) + (2 * (k - 1) if k else 0)

    def df(self, num_taxa: int) -> int:
        """Free parameters as IQ-TREE 2 counts them, branch lengths (2N - 3) included."""
        return 2 * num_taxa - 3 + self.substitution_parameters() + self.frequency_parameters() + self.rate_parameters()


def _dna_base(name: str, source: str) -> str:
    key = _DNA_SHOWN.get(canonical_name(name))
    if key is None:
        raise ModelError(f"{source}: unknown DNA model {name!r}; known: {', '.join(DNA_ORDER)}")
    return key


def _protein_base(name: str, source: str) -> str:
    key = canonical_name(name)
    if key not in EMPIRICAL_MODELS:
        raise ModelError(f"{source}: unknown protein matrix {name!r}; known: {', '.join(EMPIRICAL_MODELS)}")
    return key


def _automatic_rates(mrate: str | None) -> bool:
    """True for IQ-TREE's default rate set (no -mrate, or `-mrate AUTO`): the one it prunes (rule 2 above)."""
    return mrate is None or str(mrate).strip().upper() == "AUTO"


def _rate_types(mrate: str | None) -> list[str]:
    """IQ-TREE's -mrate (`E,I,G,I+G,R,I+R`; `R` means +R2..+R10, `R4` one of them) as rate suffixes.

    None or `AUTO` is IQ-TREE 2's default for DNA and protein data with invariable sites: E,I,G,I+G,R.
    """
    if _automatic_rates(mrate):
        mrate = "E,I,G,I+G,R"
    rates = []
    for token in (t.strip() for t in str(mrate).split(",")):
        upper = token.upper()
        if upper in _RATE_ALIASES:
            rates.append(_RATE_ALIASES[upper])
        elif upper in ("R", "I+R"):
            prefix = "+I" if upper == "I+R" else ""
            rates += [f"{prefix}+R{k}" for k in range(FREE_RATE_RANGE[0], FREE_RATE_RANGE[1] + 1)]
        elif (upper.startswith("R") or upper.startswith("I+R")) and upper.split("R", 1)[1].isdigit() \
                and int(upper.split("R", 1)[1]) >= 2:
            rates.append(("+I" if upper.startswith("I+") else "") + "+R" + upper.split("R", 1)[1])
        else:
            raise ModelError(f"mrate: unknown rate type {token!r}; use E, I, G, I+G, R, I+R or Rk (k >= 2)")
    return list(dict.fromkeys(rates))


def default_candidates(alignment: Alignment, mset: str | None = None, mrate: str | None = None) -> list[Candidate]:
    """IQ-TREE 2's `-m MF` candidates for `alignment`'s data type, narrowed by `mset` and `mrate` as -mset/-mrate do.

    Order as IQ-TREE's: substitution model (and frequencies) first, rate type second.
    """
    rates = _rate_types(mrate)
    if alignment.alphabet == DNA:
        names = DNA_ORDER if mset is None else [_dna_base(t.strip(), "mset") for t in str(mset).split(",")]
        subs = [(n, "" if n in _EQUAL_IN_IQTREE else "+F") for n in dict.fromkeys(names)]
    elif alignment.alphabet == PROTEIN:
        names = PROTEIN_ORDER if mset is None else [_protein_base(t.strip(), "mset") for t in str(mset).split(",")]
        subs = [(n, f) for n in dict.fromkeys(names) for f in ("", "+F")]
    else:
        raise InputError(f"{alignment.source}: model selection covers DNA and protein data, not "
                         f"{alignment.alphabet.name}")
    return [Candidate(base + freq + rate, base, freq, rate) for base, freq in subs for rate in rates]


def parse_candidate(string: str, alignment: Alignment) -> Candidate:
    """A candidate from a model string such as `HKY+F+G4`, `K2P+I`, `LG+F+R3` (no values in braces)."""
    terms = [t.strip() for t in str(string).split("+")]
    if not terms[0] or "{" in string:
        raise ModelError(f"candidate {string!r}: give a model name and terms without values, e.g. HKY+F+G4")
    protein = alignment.alphabet == PROTEIN
    base = _protein_base(terms[0], f"candidate {string!r}") if protein else _dna_base(terms[0], f"candidate {string!r}")
    frequency, rate = "", []
    for term in terms[1:]:
        upper = term.upper()
        if upper == "F":
            frequency = "+F"
        elif upper == "I":
            rate.insert(0, "+I")
        elif upper in ("G", "G4"):
            rate.append("+G4")
        elif upper.startswith("R") and upper[1:].isdigit() and int(upper[1:]) >= 2:
            rate.append("+R" + upper[1:])
        else:
            raise ModelError(f"candidate {string!r}: unsupported term '+{term}' (model selection knows +F, +I, "
                             "+G4, +R k)")
    if len(rate) > 2 or (len(rate) == 2 and rate[0] != "+I"):
        raise ModelError(f"candidate {string!r}: at most one of +G4 and +R k, with or without +I")
    if not protein:
        if base in _EQUAL_IN_IQTREE and frequency:
            raise ModelError(f"candidate {string!r}: {base} has equal frequencies by definition; drop +F")
        if base not in _EQUAL_IN_IQTREE:
            frequency = "+F"  # IQ-TREE's convention: a free-frequency DNA model without a term uses +F
    rate_text = "".join(rate)
    return Candidate(base + frequency + rate_text, base, frequency, rate_text)


# ----------------------------------------------------------------------------------------- the fitted program


class _Exchangeable(SubstitutionModel):
    """A reversible model given by its exchangeability matrix (data, so every matrix shares one program)."""

    matrix: jax.Array
    frequencies: jax.Array
    alphabet: object = eqx.field(static=True)

    def exchangeabilities(self):
        return self.matrix


class _Categories(RateVariation):
    """Rate categories given as arrays (zero weights allowed: padding)."""

    rates: jax.Array
    weights: jax.Array

    def categories(self):
        return self.rates, self.weights


class _Spec(eqx.Module):
    """A candidate as arrays, so that every candidate of one state count shares one compiled fit.

    Exchangeabilities `R = sum_c exp(theta_c free_c) basis_c` (DNA: one basis
    matrix per rate class, GT's class the reference; protein: the matrix, fixed);
    frequencies fixed. Rate variation in a padded layout of `1 + K` categories
    (K = 4, or 10 past +R4): category 0 the invariable sites (weight
    `invariant * p`), then the Gamma's four (`gamma`), the `free_mask`ed +R
    categories, or one category of rate 1; unused categories have weight 0.
    """

    basis: jax.Array  # [classes, S, S]
    free: jax.Array  # [classes] 1.0 where theta_c is estimated
    frequencies: jax.Array  # [S]
    invariant: jax.Array  # 1.0 with +I
    gamma: jax.Array  # 1.0 with +G4
    free_mask: jax.Array  # [K] 1.0 for the categories of +R k
    alphabet: object = eqx.field(static=True)


def _padding(candidates) -> int:
    """K of the padded layout: 4 unless some candidate has +R5 or more, then 10."""
    return 4 if max(c.categories for c in candidates) <= 4 else max(10, max(c.categories for c in candidates))


def _spec(candidate: Candidate, empirical: np.ndarray, padding: int) -> _Spec:
    k = candidate.categories
    rates = dict(invariant=jnp.asarray(float("+I" in candidate.rate)), gamma=jnp.asarray(float("G" in candidate.rate)),
                 free_mask=jnp.asarray((np.arange(padding) < k).astype(float)))
    if candidate.protein:
        matrix, own = empirical_matrix(candidate.base)
        pi = empirical if candidate.frequency else own
        return _Spec(jnp.asarray(matrix[None]), jnp.zeros(1), jnp.asarray(pi), alphabet=PROTEIN, **rates)
    classes = rate_classes(NAMED_DNA_MODELS[_DNA_NAMES[candidate.base]][0])
    k = max(classes) + 1
    basis = np.zeros((6, 4, 4))
    for (i, j), c in zip(_PAIRS, classes):
        basis[c, i, j] = basis[c, j, i] = 1.0
    free = np.zeros(6)
    free[: k - 1] = 1.0  # GT's class (k - 1) is the reference, rate 1
    pi = empirical if candidate.frequency else np.full(4, 0.25)
    return _Spec(jnp.asarray(basis), jnp.asarray(free), jnp.asarray(pi), alphabet=DNA, **rates)


def _shape(u):
    """Gamma shape in IQ-TREE's bounds [0.02, 1000], log-sigmoid in `u`."""
    return jnp.exp(math.log(MIN_SHAPE) + (math.log(MAX_SHAPE) - math.log(MIN_SHAPE)) * jax.nn.sigmoid(u))


def _shape_inverse(shape: float) -> float:
    x = (math.log(min(max(shape, 1.01 * MIN_SHAPE), 0.99 * MAX_SHAPE)) - math.log(MIN_SHAPE)) / (
        math.log(MAX_SHAPE) - math.log(MIN_SHAPE))
    return math.log(x / (1 - x))


def _proportion_invariant(u):
    return MAX_INVARIANT * jax.nn.sigmoid(u)


def _free_rates(params, mask):
    """+R k weights (softmax over the active categories) and rates (exp), rescaled to mean rate one.

    With no active category (not a +R candidate) both are zero, and finite, gradients included.
    """
    logits = jnp.where(mask > 0, params["free_weights"], 0.0)
    weights = jnp.exp(logits - jnp.max(logits)) * mask
    weights = weights / jnp.maximum(jnp.sum(weights), 1e-300)
    rates = jnp.exp(jnp.where(mask > 0, params["free_rates"], 0.0)) * mask
    mean = jnp.sum(weights * rates)
    return rates / jnp.where(mean > 0, mean, 1.0), weights


def _categories(params: dict, spec: _Spec) -> _Categories:
    """The padded `1 + K` categories of the candidate that `spec` describes (see `_Spec`)."""
    padding = spec.free_mask.shape[-1]
    one_hot = (jnp.arange(padding) == 0).astype(float)
    gamma = jnp.concatenate([discrete_gamma_rates(_shape(params["gamma"]), 4), jnp.zeros(padding - 4)])
    gamma_weights = jnp.concatenate([jnp.full(4, 0.25), jnp.zeros(padding - 4)])
    free, free_weights = _free_rates(params, spec.free_mask)
    uses_free = jnp.sum(spec.free_mask) > 0
    rates = jnp.where(spec.gamma > 0, gamma, jnp.where(uses_free, free, one_hot))
    weights = jnp.where(spec.gamma > 0, gamma_weights, jnp.where(uses_free, free_weights, one_hot))
    p = spec.invariant * _proportion_invariant(params["invariant"])
    return _Categories(jnp.concatenate([jnp.zeros(1), rates / (1.0 - p)]),
                       jnp.concatenate([jnp.reshape(p, (1,)), (1.0 - p) * weights]))


def _site_model(params: dict, spec: _Spec) -> Model:
    scale = jnp.exp(jnp.where(spec.free > 0, params["exchangeabilities"], 0.0))
    matrix = jnp.einsum("c,cij->ij", scale, spec.basis)
    return Model(_Exchangeable(matrix, spec.frequencies, spec.alphabet), _categories(params, spec))


def _objective(params, spec: _Spec, tree: Tree, data, precision):
    tree = tree.with_branch_lengths(_tree_lengths(params["lengths"], tree))
    return -data_log_likelihood(data, tree, _site_model(params, spec), precision=precision)


@eqx.filter_jit
def _fit_batch(params, specs, tree, data, precision, tolerance, max_iterations):
    """`minimise` vmapped over candidates: `(params, -log L, iterations)`, each with a leading axis."""
    def one(p, s):
        return minimise(_objective, p, (s, tree, data, precision), "lbfgs", tolerance, max_iterations)
    return jax.vmap(one)(params, specs)


# ----------------------------------------------------------------------------------------- results


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
    tree = _bionj_start(alignment) if tree is None else tree
    return {name: select_model(part, tree, **options) for name, part in zip(scheme.names, parts)}


def _bionj_start(alignment: Alignment) -> Tree:
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


def _criterion(criterion: str) -> str:
    lookup = {c.upper(): c for c in CRITERIA}
    if not isinstance(criterion, str) or criterion.upper() not in lookup:
        raise ModelError(f"criterion must be one of {', '.join(CRITERIA)}, not {criterion!r}")
    return lookup[criterion.upper()]


# ----------------------------------------------------------------------------------------- the selection


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
        rates = np.maximum(_gamma_category_means(shape, k), 1e-6)
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


def fit_free_rate_sequences(candidates: list[Candidate], fit, score) -> None:
    """IQ-TREE 2's rule for +R k (`CandidateModelSet::test` of 2.0.7): each sequence of one substitution model and
    frequencies, with or without +I, is fitted in increasing k; once +R k scores worse (strictly greater
    criterion) than the same sequence's +R(k-1), its higher k are skipped. `fit(batch)` fits a list of candidates
    (one step of every live sequence at a time); `score(candidate)` is its criterion after fitting.
    """
    sequences: dict[tuple, list[Candidate]] = {}
    for c in candidates:
        sequences.setdefault((c.base, c.frequency, c.rate.startswith("+I")), []).append(c)
    queues = [sorted(cs, key=lambda c: c.categories) for cs in sequences.values()]
    scores = [{} for _ in queues]  # per sequence: {k: criterion}
    while True:
        current = [q[0] for q in queues if q]
        if not current:
            return
        fit(current)
        for q, fitted in zip(queues, scores):
            if not q:
                continue
            c = q.pop(0)
            fitted[c.categories] = score(c)
            previous = fitted.get(c.categories - 1)
            if previous is not None and fitted[c.categories] > previous:
                q.clear()


def _gamma_category_means(shape: float, k: int) -> np.ndarray:
    """`discrete_gamma_rates(shape, k)` on the host (scipy): a +R k start with no program compiled per k.

    Yang's mean rates: x_i the i/k quantile of Gamma(a, 1), rate_i = k [P(a + 1, x_i) - P(a + 1, x_(i-1))].
    """
    x = scipy.special.gammaincinv(shape, np.arange(1, k) / k)
    cdf = np.concatenate([[0.0], scipy.special.gammainc(shape + 1.0, x), [1.0]])
    return k * np.diff(cdf)


def _pad(values, padding):
    return np.concatenate([values, np.zeros(padding - len(values))])


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
    tree = _bionj_start(alignment) if tree is None else tree
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


def _rate_variation(candidate: Candidate, params: dict, spec: _Spec) -> RateVariation:
    """The fitted rate variation as jaxphylo's own classes (DiscreteGamma, FreeRates, InvariantSites)."""
    rates = UniformRates()
    if "G" in candidate.rate:
        rates = DiscreteGamma(_shape(params["gamma"]), 4)
    elif candidate.categories:
        free, weights = _free_rates(params, spec.free_mask)
        rates = FreeRates(weights[: candidate.categories], free[: candidate.categories])
    if "+I" in candidate.rate:
        rates = InvariantSites(_proportion_invariant(params["invariant"]), rates)
    return rates
