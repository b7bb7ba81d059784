"""Ready-made NumPyro models on a fixed topology: the analyses the command line runs.

Unrooted (no clock): branch lengths in substitutions per site, i.i.d.
Exponential(`branch_rate`) or Gamma–Dirichlet.

Time trees (`clock="strict"` or `"relaxed"`): node heights under a tree prior
(`coalescent`, `exponential`, `skygrid`, `yule`, `birth-death`), reached through the ratio
transform; branch lengths are `rate x duration`. With tip dates the mean clock
rate gets the CTMC reference prior Gamma(1/2, tree length in time) (Ferreira &
Suchard 2008, BEAST's default); without them heights are in substitutions and
the mean rate is 1. The relaxed clock is uncorrelated lognormal: branch rates
`m exp(s z - s^2 / 2)`, `z ~ N(0, 1)` (non-centred, so NUTS sees no funnel),
`s ~ Exponential(3)` (mean 1/3, BEAST's default). Scale hyperparameters
(population size, birth rate) get the 1/x prior (improper). The exponential-growth
coalescent's growth rate is Laplace(0, `growth_rate_scale`) (BEAUti 1.10.4's default:
scale 1, in 1 / time units). The skygrid's smoothing precision is Gamma(0.001, 0.001),
or fixed at `skygrid_precision` when given.

Tip-date sampling (BEAST's): a tip dated to an interval `[a, b]` (decimal
years) has its height `reference - date` sampled under a uniform prior on
`[reference - b, reference - a]`, site `tip_heights_free` (one entry per such
tip, in tree order), before the node heights, whose anchors follow it.
`reference` is the latest upper bound of any tip (height 0); the dates
themselves are the deterministic site `tip_dates` (`date_<taxon>` in the logs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from ...data import Alignment, distances
from ..._errors import ModelError
from ...tree import TimeTree, Tree, branch_durations, start_heights, time_tree, with_sampled_tips
from ...io import TipDates, from_dendropy, read_partitions, to_dendropy
from ...likelihood import partitioned_data, pattern_data
from ...models import (
    LINKS,
    MRBAYES_PRIORS,
    Model,
    PartitionedModel,
    PartsEstimated,
    estimated_parameters,
    initial_values,
    parse_model,
    partitioned_model,
    sample_model,
)
from ._distribution import PhyloCTMC
from ..priors import BirthDeath, ConstantCoalescent, ExponentialCoalescent, GammaDirichlet, Skygrid, Yule

CLOCKS = (None, "strict", "relaxed")
UNROOTED_PRIORS = ("exponential", "gamma-dirichlet")
TIME_PRIORS = ("coalescent", "exponential", "skygrid", "yule", "birth-death")  # exponential: growth (with a clock)
PRIOR_SETS = {"default": {}, "mrbayes": MRBAYES_PRIORS}


@dataclass(frozen=True)
class Analysis:
    """The choices that define an analysis (saved with a run, and compared on `--resume`)."""

    model: str | None = "HKY+G4"  # None: only with `partitions` that name every part's model
    clock: str | None = None
    tree_prior: str | None = None  # default: exponential (unrooted) or coalescent (time tree)
    branch_rate: float = 10.0  # rate of the exponential branch-length prior (MrBayes's default)
    gamma_dirichlet: tuple[float, float, float] = (1.0, 0.1, 1.0)
    priors: str = "default"
    skygrid_intervals: int = 10
    skygrid_cutoff: float | None = None  # default: 1.2 x the starting tree's root height
    skygrid_precision: float | None = None  # fixed smoothing precision (default: sampled, Gamma(0.001, 0.001))
    growth_rate_scale: float = 1.0  # the exponential-growth coalescent's Laplace(0, scale) on its growth rate
    precision: str = "float64"
    partitions: str | None = None  # a partition file (NEXUS sets/charpartition, RAxML-style): a model per part
    link: str = "proportional"  # partitions' branch lengths: proportional (-p), equal (-q), unlinked (-Q)

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ModelError(f"clock must be 'strict' or 'relaxed', not {self.clock!r}")
        allowed = TIME_PRIORS if self.clock else UNROOTED_PRIORS
        if self.tree_prior is not None and self.tree_prior not in allowed:
            kind = "a time tree (--clock)" if self.clock else "an unrooted tree (no --clock)"
            raise ModelError(f"tree prior {self.tree_prior!r} does not apply to {kind}; choose from {', '.join(allowed)}")
        if self.skygrid_precision is not None and not (self.clock and self.tree_prior == "skygrid"):
            raise ModelError("skygrid_precision fixes the skygrid's smoothing precision: it needs tree_prior='skygrid'")
        if self.skygrid_precision is not None and not self.skygrid_precision > 0:
            raise ModelError(f"the skygrid precision must be positive, got {self.skygrid_precision}")
        if not self.growth_rate_scale > 0:
            raise ModelError(f"the growth rate's Laplace scale must be positive, got {self.growth_rate_scale}")
        if self.priors not in PRIOR_SETS:
            raise ModelError(f"prior set must be one of {', '.join(PRIOR_SETS)}, not {self.priors!r}")
        if not self.branch_rate > 0:
            raise ModelError(f"the branch-length prior's rate must be positive, got {self.branch_rate}")
        if self.link not in LINKS:
            raise ModelError(f"link must be one of {', '.join(LINKS)}, not {self.link!r}")
        if self.model is None and not self.partitions:
            raise ModelError("no model: a model string is needed (None serves only with partitions that name "
                             "every part's model)")
        if self.partitions and self.link == "unlinked" and self.clock:
            raise ModelError("unlinked branch lengths (-Q) are not one time tree: with --clock use -p or -q")

    @property
    def resolved_tree_prior(self) -> str:
        return self.tree_prior or ("coalescent" if self.clock else "exponential")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Prepared:
    """A NumPyro model `model(data)`, its data, a start, and what the outputs need."""

    model: callable
    data: object
    init: dict
    tree: Tree
    time: TimeTree | None
    reference: float | None = None  # the decimal year at height 0, when built from TipDates
    substitution: object = None  # the substitution model at its starting values (a PartitionedModel with parts)


def unrooted(tree: Tree) -> Tree:
    """The same tree with a bifurcating root removed (its two branches joined)."""
    if not tree.topology.rooted:
        return tree
    dtree = to_dendropy(tree)
    dtree.collapse_basal_bifurcation()
    dtree.is_rooted = False
    return from_dendropy(dtree, "<tree>", None)


def prepare(alignment: Alignment, tree: Tree, analysis: Analysis, tip_dates=None) -> Prepared:
    """Build the NumPyro model of `analysis` for `alignment` on the topology of `tree`.

    `tip_dates`: fixed tip heights (an array in the tree's taxa order, years or
    substitutions before the latest tip), or a `jaxphylo.io.TipDates`, whose
    intervals and undated tips become sampled tip heights (see the module).
    """
    model, estimated = _substitution_model(alignment, analysis)
    if isinstance(model, Model):  # what stays fixed is computed once, not at every leapfrog step
        model = model.with_fixed_parts(estimated)
    priors = PRIOR_SETS[analysis.priors]
    init = initial_values(model, estimated)
    if analysis.clock is None:
        if tip_dates is not None:
            raise ModelError("tip dates need a clock (a time tree): choose clock='strict' or 'relaxed'")
        tree = unrooted(tree)
        data = _data(alignment, tree, model)
        build = _unrooted_model(tree, model, estimated, priors, analysis)
        lengths = jnp.asarray(np.clip(np.asarray(tree.branch_lengths[:-1], float), 1e-4, None))
        if _unlinked(model):
            init["part_branch_lengths"] = jnp.broadcast_to(lengths, (model.num_parts,) + lengths.shape)
        else:
            init["branch_lengths"] = lengths
        return Prepared(build, data, init, tree, None, substitution=model)
    time, reference = _time_tree_of(tree, tip_dates)
    data = _data(alignment, tree, model)
    tips, heights = start_heights(tree, time)
    dated = not time.contemporaneous
    rate = rate_guess(alignment, tips, heights) if dated else 1.0
    init.update(_time_tree_start(analysis, time, tips, heights, rate))
    cutoff = analysis.skygrid_cutoff or 1.2 * float(heights[-1])
    build = _time_tree_model(time, model, estimated, priors, analysis, dated, cutoff, reference)
    return Prepared(build, data, init, tree, time, reference, substitution=model)


def _substitution_model(alignment: Alignment, analysis: Analysis):
    """`(model, estimated)`: the model string's, or with `partitions` a model per part (`PartsEstimated`,
    the part rates free under -p); the string then serves the parts that name no model."""
    if not analysis.partitions:
        return parse_model(analysis.model, alignment=alignment), estimated_parameters(analysis.model)
    model = partitioned_model(read_partitions(analysis.partitions), alignment, default_model=analysis.model,
                              link=analysis.link)
    return model, PartsEstimated(tuple(estimated_parameters(s) for s in model.model_strings), True)


def _data(alignment: Alignment, tree: Tree, model):
    return partitioned_data(alignment, tree, model) if isinstance(model, PartitionedModel) else \
        pattern_data(alignment, tree)


def _unlinked(model) -> bool:
    return isinstance(model, PartitionedModel) and model.link == "unlinked"


def _time_tree_of(tree: Tree, tip_dates) -> tuple[TimeTree, float | None]:
    """The time tree of `tree`'s topology with fixed heights or `TipDates`, and the year at height 0."""
    if not isinstance(tip_dates, TipDates):
        return time_tree(tree.topology, tip_dates), None
    bounds = tip_dates.heights(tree.taxa)
    if bounds.fixed:
        return time_tree(tree.topology, bounds.lower), bounds.reference
    return time_tree(tree.topology, tip_bounds=np.stack([bounds.lower, bounds.upper])), bounds.reference


def _unrooted_model(tree, model, estimated, priors, analysis):
    num_branches = tree.topology.num_nodes - 1
    if analysis.resolved_tree_prior == "exponential":
        branch_prior = dist.Exponential(analysis.branch_rate).expand([num_branches]).to_event(1)
    else:
        branch_prior = GammaDirichlet(num_branches, *analysis.gamma_dirichlet)

    def unrooted_tree_model(data):
        substitution = None
        if _unlinked(model):  # every part its own lengths, each with the prior; their site-weighted mean logged
            parts = numpyro.sample("part_branch_lengths", branch_prior.expand([model.num_parts]).to_event(1))
            lengths = numpyro.deterministic("branch_lengths", jnp.average(parts, axis=0, weights=jnp.asarray(
                model.site_counts, parts.dtype)))
            substitution = model.with_branch_lengths(jnp.concatenate([parts, jnp.zeros_like(parts[:, :1])], axis=1))
        else:
            lengths = numpyro.sample("branch_lengths", branch_prior)
        numpyro.deterministic("tree_length", jnp.sum(lengths))
        substitution = sample_model(substitution or model, estimated, priors)
        phylogeny = tree.with_branch_lengths(jnp.append(lengths, 0.0))
        numpyro.sample("alignment", PhyloCTMC(phylogeny, substitution, precision=analysis.precision), obs=data)

    return unrooted_tree_model


def _improper_positive(name):
    """A scale parameter with the 1/x prior."""
    value = numpyro.sample(name, dist.ImproperUniform(constraints.positive, (), ()))
    numpyro.factor(f"{name}_prior", -jnp.log(value))
    return value


def _tree_prior(analysis, time, cutoff, tips):
    kind = analysis.resolved_tree_prior
    if kind == "coalescent":
        return ConstantCoalescent(time, _improper_positive("population_size"), tip_heights=tips)
    if kind == "exponential":  # BEAST's: N0 ~ 1/x, growth rate ~ Laplace(0, scale)
        size = _improper_positive("population_size")
        growth = numpyro.sample("growth_rate", dist.Laplace(0.0, analysis.growth_rate_scale))
        return ExponentialCoalescent(time, size, growth, tip_heights=tips)
    if kind == "yule":
        return Yule(time, _improper_positive("birth_rate"))
    if kind == "birth-death":
        net = _improper_positive("net_diversification")
        turnover = numpyro.sample("turnover", dist.Uniform(0.0, 1.0))
        return BirthDeath(time, net / (1 - turnover), net * turnover / (1 - turnover))
    k = analysis.skygrid_intervals
    first = numpyro.sample("skygrid_first", dist.ImproperUniform(constraints.real, (), ()))
    precision = analysis.skygrid_precision
    if precision is None:
        precision = numpyro.sample("skygrid_precision", dist.Gamma(0.001, 0.001))
    steps = numpyro.sample("skygrid_steps", dist.Normal(0.0, 1.0).expand([k - 1]).to_event(1))
    sizes = first + jnp.concatenate([jnp.zeros(1), jnp.cumsum(steps)]) / jnp.sqrt(precision)
    numpyro.deterministic("log_population_sizes", sizes)
    return Skygrid(time, sizes, cutoff, tip_heights=tips)


def sample_tip_heights(time: TimeTree, reference: float | None):
    """All tip heights, with the sampled tips' drawn from Uniform(low, high) (site `tip_heights_free`);
    `None` when every tip is fixed. Their dates `reference - height` are the site `tip_dates`."""
    if not time.sampled:
        return None
    low, high = time.free_bounds
    free = numpyro.sample("tip_heights_free", dist.Uniform(low, high).to_event(1))
    if reference is not None:
        numpyro.deterministic("tip_dates", reference - free)
    return with_sampled_tips(time, free)


def _time_tree_model(time, model, estimated, priors, analysis, dated, cutoff, reference):
    num_branches = time.topology.num_nodes - 1

    def time_tree_model(data):
        tips = sample_tip_heights(time, reference)
        heights = numpyro.sample("node_heights", _tree_prior(analysis, time, cutoff, tips))
        durations = branch_durations(time, heights, tips)[:-1]
        if dated:
            rate = numpyro.sample("clock_rate", dist.Gamma(0.5, jnp.sum(durations)))
        else:
            rate = 1.0
        if analysis.clock == "relaxed":
            spread = numpyro.sample("rate_spread", dist.Exponential(3.0))
            z = numpyro.sample("rate_z", dist.Normal(0.0, 1.0).expand([num_branches]).to_event(1))
            rate = numpyro.deterministic("branch_rates", rate * jnp.exp(spread * z - spread**2 / 2))
        lengths = numpyro.deterministic("branch_lengths", rate * durations)
        numpyro.deterministic("tree_length", jnp.sum(lengths))
        numpyro.deterministic("root_height", heights[-1])
        substitution = sample_model(model, estimated, priors)
        phylogeny = Tree(jnp.append(lengths, 0.0), time.topology)
        numpyro.sample("alignment", PhyloCTMC(phylogeny, substitution, precision=analysis.precision), obs=data)

    return time_tree_model


def rate_guess(alignment, tips, heights):
    """Mean JC69 distance over twice the mean time back to the root: a start for the clock rate."""
    d = distances(alignment, "jc69" if alignment.alphabet.num_states == 4 else None, saturated=3.0)
    mean_distance = float(np.mean(d[np.triu_indices(len(d), 1)]))
    mean_depth = float(heights[-1] - np.mean(tips))
    return max(mean_distance / (2 * mean_depth), 1e-12)


def _time_tree_start(analysis, time, tips, heights, rate):
    root = float(heights[-1])
    n = time.num_tips
    start = {"node_heights": jnp.asarray(heights)}
    if time.sampled:
        start["tip_heights_free"] = jnp.asarray(tips[time.free_tips])
    if not time.contemporaneous:
        start["clock_rate"] = jnp.asarray(rate)
    kind = analysis.resolved_tree_prior
    if kind in ("coalescent", "exponential"):
        start["population_size"] = jnp.asarray(root / 2)
        if kind == "exponential":
            start["growth_rate"] = jnp.asarray(0.0)  # BEAUti's start
    elif kind == "yule":
        start["birth_rate"] = jnp.asarray(np.log(n) / root)
    elif kind == "birth-death":
        start.update(net_diversification=jnp.asarray(np.log(n) / root), turnover=jnp.asarray(0.5))
    else:
        k = analysis.skygrid_intervals
        start.update(skygrid_first=jnp.asarray(np.log(root / 2)), skygrid_steps=jnp.zeros(k - 1))
        if analysis.skygrid_precision is None:
            start["skygrid_precision"] = jnp.asarray(1.0)
    if analysis.clock == "relaxed":
        start.update(rate_spread=jnp.asarray(0.1), rate_z=jnp.zeros(time.topology.num_nodes - 1))
    return start
