"""Priors on trees: branch lengths of unrooted trees, node heights of time trees.

Node-height priors are NumPyro distributions whose support is `NodeHeights`;
NumPyro reaches that support from unconstrained space through the ratio
transform (`RatioTransform`, registered with `biject_to`), so
`numpyro.sample("node_heights", ConstantCoalescent(time_tree, 10.0))` is all a
model needs: NUTS moves in the unconstrained space and the log-Jacobian is
added for it.

Where some tip heights are parameters (tip-date sampling), pass their current
values as `tip_heights=`: the support, and so the transform, then depend on
them (their anchors move), and the tips' own prior and Jacobian belong to
their own sample site, sampled before the node heights.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from jaxtyping import Array, Float
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.transforms import Transform, biject_to

from ..._errors import InputError, ModelError
from ...tree import TimeTree, all_heights, heights_to_ratios, ratio_log_jacobian, ratios_to_heights

TipHeights = Float[Array, " tips"] | None  # the current tip heights where some are sampled, else None


class GammaDirichlet(Distribution):
    """Gamma–Dirichlet prior on unrooted branch lengths (Rannala, Zhu & Yang 2012).

    The tree length `T = sum b` is Gamma(`shape`, `rate`) and the proportions
    `b / T` are Dirichlet(`concentration`), so with `B` branches

        log p(b) = log Gamma(T; shape, rate) + log Dir(b / T; c) - (B - 1) log T.

    MrBayes calls it `brlenspr=unconstrained:gammadir(shape, rate, c, 1)`.
    """

    arg_constraints = {"length_shape": constraints.positive, "length_rate": constraints.positive,
                       "concentration": constraints.positive}

    def __init__(self, num_branches: int, shape=1.0, rate=0.1, concentration=1.0, validate_args=None):
        self.num_branches = num_branches
        self.length_shape, self.length_rate, self.concentration = shape, rate, concentration
        super().__init__(batch_shape=(), event_shape=(num_branches,), validate_args=validate_args)

    @property
    def support(self):
        return constraints.independent(constraints.positive, 1)

    def sample(self, key, sample_shape=()):
        k1, k2 = jax.random.split(key)
        total = jax.random.gamma(k1, self.length_shape, sample_shape) / self.length_rate
        c = jnp.full(self.num_branches, self.concentration)
        return total[..., None] * jax.random.dirichlet(k2, c, sample_shape)

    def log_prob(self, value: Float[Array, "... branches"]):
        b, a, c, rate = self.num_branches, self.length_shape, self.concentration, self.length_rate
        total = jnp.sum(value, -1)
        log_gamma = a * jnp.log(rate) - gammaln(a) + (a - 1) * jnp.log(total) - rate * total
        log_dirichlet = gammaln(b * c) - b * gammaln(c) + (c - 1) * jnp.sum(jnp.log(value / total[..., None]), -1)
        return log_gamma + log_dirichlet - (b - 1) * jnp.log(total)


class NodeHeights(constraints.Constraint):
    """Internal node heights of `tree`, each above its children (tips at `tips`, default the tree's)."""

    event_dim = 1

    def __init__(self, tree: TimeTree, tips: TipHeights = None):
        self.tree, self.tips = tree, tips

    def __call__(self, heights):
        heights = jnp.asarray(heights)
        h = jnp.vectorize(lambda x: all_heights(self.tree, x, self.tips), signature="(k)->(m)")(heights)
        parent = self.tree.topology.parent_array
        return jnp.all(h[..., parent[:-1]] > h[..., :-1], -1)

    def feasible_like(self, prototype):
        k = self.tree.num_internal
        feasible = ratios_to_heights(self.tree, jnp.ones(()), jnp.full(k - 1, 0.5), self.tips)
        return jnp.broadcast_to(feasible, prototype.shape)

    def tree_flatten(self):
        return (self.tips,), (("tips",), {"tree": self.tree})


class RatioTransform(Transform):
    """Unconstrained `x` to node heights: `x[:-1]` are logits of the ratios, `x[-1]` the log root offset."""

    domain = constraints.real_vector

    def __init__(self, tree: TimeTree, tips: TipHeights = None):
        self.tree, self.tips = tree, tips

    @property
    def codomain(self):
        return NodeHeights(self.tree, self.tips)

    def __call__(self, x):
        def one(v):
            return ratios_to_heights(self.tree, jnp.exp(v[-1]), jax.nn.sigmoid(v[:-1]), self.tips)
        return jnp.vectorize(one, signature="(k)->(k)")(x)

    def _inverse(self, y):
        def one(h):
            offset, ratios = heights_to_ratios(self.tree, h, self.tips)
            return jnp.concatenate([jax.scipy.special.logit(ratios), jnp.log(offset)[None]])
        return jnp.vectorize(one, signature="(k)->(k)")(y)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        logits = x[..., :-1]
        log_sigmoid_slope = -jax.nn.softplus(-logits) - jax.nn.softplus(logits)
        jacobian = jnp.vectorize(lambda h: ratio_log_jacobian(self.tree, h, self.tips), signature="(k)->()")(y)
        return jacobian + jnp.sum(log_sigmoid_slope, -1) + x[..., -1]

    def tree_flatten(self):
        return (self.tips,), (("tips",), {"tree": self.tree})


@biject_to.register(NodeHeights)
def _ratio_transform(constraint):
    return RatioTransform(constraint.tree, constraint.tips)


class NodeHeightPrior(Distribution):
    """A prior density on the internal node heights of a fixed rooted topology, given the tip heights.

    `tip_heights`: the current heights of all tips where some are sampled
    (`None`: the tree's fixed ones).
    """

    def __init__(self, tree: TimeTree, validate_args=None, *, tip_heights: TipHeights = None):
        self.tree, self.tip_heights = tree, tip_heights
        super().__init__(batch_shape=(), event_shape=(tree.num_internal,), validate_args=validate_args)

    @property
    def support(self):
        return NodeHeights(self.tree, self.tip_heights)

    def sample(self, key, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} gives a density on a fixed topology; "
                                  "it does not simulate trees")


def _require_binary(tree: TimeTree, what: str) -> None:
    children = np.bincount(tree.topology.parent_array[:-1], minlength=tree.topology.num_nodes)
    if np.any(children[tree.num_tips:] != 2):
        raise InputError(f"the {what} prior needs a binary rooted tree; this one has a polytomy")


def coalescent_log_density(tree: TimeTree, heights, log_population_sizes, grid=(), tips: TipHeights = None):
    """Log density of the node heights under the coalescent with `log theta = log_population_sizes[j]`
    between grid points `grid[j-1]` and `grid[j]` (one size and no grid: constant). See
    `coalescent_times_log_density`."""
    return coalescent_times_log_density(all_heights(tree, heights, tips), tree.num_tips, log_population_sizes, grid)


def _coalescent_events(node_heights: Float[Array, " nodes"], num_tips: int, grid=()):
    """Every sampling, coalescent and grid event sorted by time: `(times [E], change [E], lineages [E-1])`,
    `change` +1 for a tip, -1 for a coalescence, 0 for a grid point, `lineages[i]` alive on `(times[i],
    times[i+1])`."""
    grid = np.asarray(grid, float)
    times = jnp.concatenate([node_heights, jnp.asarray(grid, node_heights.dtype)])
    internal = node_heights.shape[-1] - num_tips
    change = np.concatenate([np.ones(num_tips), -np.ones(internal), np.zeros(len(grid))])
    order = jnp.argsort(times)  # an integer order: `times[order]` carries the gradient
    times, change = times[order], jnp.asarray(change)[order]
    return times, change, jnp.cumsum(change)[:-1]


def coalescent_times_log_density(node_heights: Float[Array, " nodes"], num_tips: int, log_population_sizes,
                                 grid=()) -> Float[Array, ""]:
    """The coalescent's log density of a labelled history with heights `node_heights` (tips first).

    Every sampling, coalescent and grid event is sorted once by time; between consecutive
    events `k` lineages coalesce at rate `C(k, 2) / theta`, and each coalescence adds `-log theta`.
    The topology does not enter: every labelled history with these times is equally likely.
    """
    times, change, lineages = _coalescent_events(node_heights, num_tips, grid)
    log_theta = jnp.asarray(log_population_sizes)[jnp.searchsorted(jnp.asarray(grid), times, side="right")]
    intervals = lineages * (lineages - 1) / 2 * jnp.diff(times) * jnp.exp(-log_theta[:-1])
    return -jnp.sum(intervals) - jnp.sum(jnp.where(change < 0, log_theta, 0.0))


def _expm1_over(x):
    """`(e^x - 1) / x`, 1 at 0, with a finite gradient there (its Taylor series where `|x| < 1e-4`: the
    first omitted term, `x^4 / 120`, is below 1e-18)."""
    small = jnp.abs(x) < 1e-4
    safe = jnp.where(small, 1.0, x)  # keeps the other branch's gradient finite at 0
    return jnp.where(small, 1 + x / 2 + x**2 / 6 + x**3 / 24, jnp.expm1(safe) / safe)


def exponential_coalescent_times_log_density(node_heights: Float[Array, " nodes"], num_tips: int,
                                             log_population_size, growth_rate) -> Float[Array, ""]:
    """The coalescent's log density of a labelled history when the population size at height `t` is
    `N(t) = N0 exp(-g t)` (BEAST's exponential growth: `N0` at height 0, `g > 0` growing towards the present).

    Between consecutive events at heights `a < b`, `k` lineages coalesce with intensity

        C(k, 2) integral_a^b e^(g t) / N0 dt = C(k, 2) e^(g a) (b - a) E(g (b - a)) / N0,
        E(x) = (e^x - 1) / x  (E(0) = 1, so g = 0 is the constant coalescent, continuously),

    and a coalescence at `t` adds `-log N(t) = -log N0 + g t`. Time runs from height 0 (the latest tip, or the
    latest bound of a sampled tip's dates), as BEAST's does. With `g < 0` the intensity stays finite as
    `t -> inf` and lineages may never meet: the density of finite trees then integrates to less than one,
    as BEAST's, which does not renormalise it, does too.
    """
    times, change, lineages = _coalescent_events(node_heights, num_tips)
    pairs = lineages * (lineages - 1) / 2
    active = pairs > 0  # an interval with fewer than two lineages adds nothing; keep e^(g a) from overflowing there
    start = jnp.where(active, times[:-1], 0.0)
    width = jnp.where(active, jnp.diff(times), 0.0)
    log_n0 = jnp.asarray(log_population_size)
    intensity = pairs * jnp.exp(growth_rate * start - log_n0) * width * _expm1_over(growth_rate * width)
    log_sizes = log_n0 - growth_rate * times
    return -jnp.sum(jnp.where(active, intensity, 0.0)) - jnp.sum(jnp.where(change < 0, log_sizes, 0.0))


class ConstantCoalescent(NodeHeightPrior):
    """Kingman's coalescent with constant effective population size `population_size` (in time units).

    With tips sampled through time (heterochronous), the density of the node
    heights is `prod_events theta^-1 * prod_intervals exp(-C(k, 2) dt / theta)`,
    `k` the lineages alive in each interval between consecutive events.
    """

    def __init__(self, tree: TimeTree, population_size, validate_args=None, *, tip_heights: TipHeights = None):
        _require_binary(tree, "coalescent")
        self.population_size = population_size
        super().__init__(tree, validate_args, tip_heights=tip_heights)

    def log_prob(self, heights: Float[Array, " internal"]):
        log_size = jnp.log(jnp.atleast_1d(self.population_size))
        return coalescent_log_density(self.tree, heights, log_size, tips=self.tip_heights)


class ExponentialCoalescent(NodeHeightPrior):
    """Kingman's coalescent under exponential growth, BEAST's parameterisation: the population size
    `N(t) = population_size x exp(-growth_rate x t)` at height `t` (time units, 0 the latest tip), so
    `growth_rate > 0` is a population growing towards the present. Tips sampled through time as for
    `ConstantCoalescent`; see `exponential_coalescent_times_log_density`. `growth_rate = 0` is
    `ConstantCoalescent(tree, population_size)`.
    """

    def __init__(self, tree: TimeTree, population_size, growth_rate, validate_args=None, *,
                 tip_heights: TipHeights = None):
        _require_binary(tree, "coalescent")
        self.population_size, self.growth_rate = population_size, growth_rate
        super().__init__(tree, validate_args, tip_heights=tip_heights)

    def log_prob(self, heights: Float[Array, " internal"]):
        return exponential_coalescent_times_log_density(all_heights(self.tree, heights, self.tip_heights),
                                                        self.tree.num_tips, jnp.log(self.population_size),
                                                        self.growth_rate)


class Skygrid(NodeHeightPrior):
    """The coalescent with a piecewise-constant population size on a fixed grid (Gill et al. 2013).

    `log_population_sizes[j]` holds on `[x_j, x_(j+1))` for the `K - 1` grid
    points `x_j = j * cutoff / (K - 1)`, the last one beyond the cutoff. The
    smoothing prior on the log sizes is separate (a Gaussian random walk in
    `inference.prepare`'s models).
    """

    def __init__(self, tree: TimeTree, log_population_sizes, cutoff: float, validate_args=None, *,
                 tip_heights: TipHeights = None):
        _require_binary(tree, "skygrid")
        self.log_population_sizes = jnp.asarray(log_population_sizes)
        k = self.log_population_sizes.shape[-1]
        self.grid = np.arange(1, k) * cutoff / max(k - 1, 1)
        super().__init__(tree, validate_args, tip_heights=tip_heights)

    def log_prob(self, heights: Float[Array, " internal"]):
        return coalescent_log_density(self.tree, heights, self.log_population_sizes, self.grid, self.tip_heights)


def birth_death_times_log_density(node_heights: Float[Array, " nodes"], num_tips: int, birth_rate, death_rate=0.0,
                                  sampling_fraction=1.0) -> Float[Array, ""]:
    """The birth–death log density of a labelled history with heights `node_heights` (tips first, all at 0).

    Conditioned on `n` sampled tips with a uniform prior on the time of origin
    (Gernhard 2008; Stadler 2009), the `n - 1` node ages are i.i.d. with density

        g(x) = lambda r^2 e^{-r x} rho / D(x)^2,   D(x) = rho lambda (1 - e^{-r x}) + r e^{-r x},

    `r = lambda - mu > 0`, and the labelled history is uniform over its
    `n! (n-1)! / 2^(n-1)` values, independent of the ages (Edwards 1970). So

        log p = (n - 1) log 2 - log n! + sum_i log g(x_i),

    the measure of `coalescent_times_log_density`: it integrates to one over
    labelled histories and their times, so a sampled topology gets its weight.
    """
    lam, mu, rho = birth_rate, death_rate, sampling_fraction
    r = lam - mu
    ages = node_heights[num_tips:]
    decay = jnp.exp(-r * ages)
    log_d = jnp.log(rho * lam * (1 - decay) + r * decay)
    log_g = jnp.log(lam) + jnp.log(rho) + 2 * jnp.log(r) - r * ages - 2 * log_d
    return (num_tips - 1) * math.log(2.0) - math.lgamma(num_tips + 1) + jnp.sum(log_g)


class BirthDeath(NodeHeightPrior):
    """Constant-rate birth–death with sampling fraction `rho` at the present (Gernhard 2008; Stadler 2009),
    conditioned on `n` tips with a uniform prior on the time of origin (not on the root): see
    `birth_death_times_log_density`, the density of a labelled history, as the coalescent's is. On a fixed
    topology that is the density of the node heights up to a constant. Tips must be contemporaneous.
    `Yule` is the case `mu = 0`, `rho = 1`.
    """

    def __init__(self, tree: TimeTree, birth_rate, death_rate=0.0, sampling_fraction=1.0, validate_args=None):
        _require_binary(tree, "birth-death")
        if not tree.contemporaneous:
            raise ModelError("birth-death and Yule priors need contemporaneous tips; "
                             "use a coalescent prior for dated tips")
        self.birth_rate, self.death_rate, self.sampling_fraction = birth_rate, death_rate, sampling_fraction
        super().__init__(tree, validate_args)

    def log_prob(self, heights: Float[Array, " internal"]):
        return birth_death_times_log_density(all_heights(self.tree, heights), self.tree.num_tips, self.birth_rate,
                                             self.death_rate, self.sampling_fraction)


class Yule(BirthDeath):
    """Pure birth at `birth_rate`: node ages i.i.d. Exponential(`birth_rate`) given n (Gernhard 2008)."""

    def __init__(self, tree: TimeTree, birth_rate, validate_args=None):
        super().__init__(tree, birth_rate, 0.0, 1.0, validate_args)
