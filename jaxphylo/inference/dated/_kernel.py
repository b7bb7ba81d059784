"""Time-tree MCMC with the topology free: BEAST's tree operators alternated with HMC, every chain on the device.

Blackjax's shape: `init` gives every chain's state (a `base.MCMCState` whose position, `TimeTreePosition`, is a
rooted time tree as arrays (`parents [M]`, `heights [M]`, see `moves/_time_tree.py`) and the continuous
parameters in unconstrained coordinates: the clock rate (`log`), the
relaxed clock's spread (`log`) and per-branch normal deviates `z` (the branch
above node `v` has rate `mu exp(s z_v - s^2 / 2)`), the coalescent's
population size (`log`), the exponential-growth coalescent's (`log N0`, growth
rate), or skygrid (first log size, log precision, steps),
Yule's birth rate (`log`) or birth–death's net diversification `lambda - mu`
(`log`) and turnover `mu / lambda` (`logit`), and the substitution model's
free parameters (`ModelCoordinates`); its adaptation is HMC's mass matrix), and `build_kernel` gives
`step(key, state) -> (state, info)`, the Metropolis–Hastings kernel of `base.py` with these proposals, run by
`tempered.py` at a ladder of heats when `DatedSettings.heats > 1` (MrBayes's Metropolis coupling: each run's cold
chain is sampled; heats are swapped, states and partials stay).

One generation either proposes a tree move for every chain (drawn per chain
with the weights of `DatedSettings.moves`: narrow and wide exchange, subtree
slide, Wilson-Balding, node height, root height), scores every proposed tree
in one batched likelihood call and accepts or rejects each, or (with
probability `weights["hmc"] / sum(weights)`, one draw for all chains) moves
every continuous parameter of every chain by HMC with the topology fixed, as
BEAST X alternates its HMC and topology kernels.

HMC moves node heights in the ratio coordinates of the current topology
(`jaxphylo.tree.ratio_coordinates_on`): `z_root = log(h_root - l_root)` and
`z_i = logit((h_i - l_i) / (h_parent(i) - l_i))`, `l_i` the oldest tip
below `i` (Ji et al. 2021), with log-Jacobian

    log |dh/dz| = z_root + sum_(i not root) [log(h_parent(i) - l_i) + log r_i + log(1 - r_i)].

Priors (those of `jaxphylo sample` for dated trees): the coalescent on the
node heights (constant size with the 1/N prior; exponential growth, BEAST's
`N(t) = N0 exp(-g t)`, with 1/N0 and Laplace(0, `growth_rate_scale`) on `g`; or
a skygrid with a Gaussian random walk on the log sizes and a Gamma(0.001, 0.001)
precision, or the precision fixed),
or for contemporaneous tips Yule (1/x on the birth rate) or birth–death (1/x
on `lambda - mu`, Uniform(0, 1) on `mu / lambda`), each the density of the
labelled history as the coalescent's is (`birth_death_times_log_density`),
the clock rate Gamma(0.5, 1 / sum of branch durations) (a CTMC-reference-like
prior), the relaxed clock's spread Exponential(3), and the model parameters'
priors of `sample` (`jaxphylo.models.sample_model`). Every density of a parameter is in its
unconstrained coordinate, Jacobian included, so a tree move's acceptance is
`dlog L + dlog prior + log q` and HMC's target is `log L + log prior + log |dh/dz|`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from jaxtyping import Array, Float
from numpyro.infer.util import potential_energy

from ..._errors import InputError
from ...likelihood import accept_partials, batch_pattern_log_likelihoods
from ...tree import anchors_on, ratio_coordinates_on, ratio_heights_on, ratio_log_jacobian_on
from ...models import Model, ModelCoordinates, sample_model
from .. import base, tempered
from ..base import MCMCState, Proposal, chain_keys, check_moves, draw_moves, mixture
from ..moves import (
    HMC_START_STEP, HMC_TARGET_ACCEPTANCE, ROOT_TUNING, START_SLIDE, TIME_TREE_MOVES, TUNED, leapfrog_trajectory, propose_time_tree,
)
from ..priors import (
    birth_death_times_log_density, coalescent_times_log_density, exponential_coalescent_times_log_density,
)

DATED_MOVES = TIME_TREE_MOVES + ("hmc",)
# BEAST 1.10's operator weights for a time tree with the four topology moves doubled and the uniform node height's
# 30 halved (HMC moves the heights too). Measured on rsv2 (129 taxa, 32 chains on an H200,
# validation/dated/results/moves): narrow exchange makes ~80% of the topology changes, and against BEAST's
# weights with the uniform halved (15/3/15/3) doubling them raised topology ESS per minute by 28%, root-height ESS
# per minute by 11% and generations per second by 51% (fewer of the costly HMC generations).
DEFAULT_DATED_MOVES = {"narrow_exchange": 30.0, "wide_exchange": 6.0, "subtree_slide": 30.0, "wilson_balding": 6.0,
                       "node_height": 15.0, "root_height": 3.0, "hmc": 3.0}
TARGET_ACCEPTANCE = 0.3
RATE_SPREAD_PRIOR = 3.0  # Exponential(3) on the relaxed clock's log-normal sd, as `sample`'s
SPECIATION_PRIORS = ("yule", "birth-death")  # contemporaneous tips only (no serially sampled birth–death)


@dataclass(frozen=True)
class DatedSettings:
    chains: int = 2  # independent runs, each written to its own files (their cold chains)
    heats: int = 1  # chains per run at beta_k = 1 / (1 + temperature k), k < heats (MrBayes's nchains); 1: unheated
    temperature: float = 0.1
    generations: int = 100_000
    sample_every: int = 100
    tune: int | None = None  # generations of tuning (default a tenth of `generations`)
    block: int = 50  # samples per device call (a checkpoint after each)
    moves: tuple = tuple(DEFAULT_DATED_MOVES.items())  # (name, weight) pairs; a dict is accepted
    hmc_steps: int = 10
    adapt_mass: bool = True  # a diagonal mass matrix for HMC from the tuning phase's coordinates
    incremental: bool = True  # keep every chain's partials and recompute only what a move touched (False: all)

    def __post_init__(self):
        object.__setattr__(self, "moves", tuple(dict(self.moves).items()))
        for name in ("chains", "heats", "generations", "sample_every", "block", "hmc_steps"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"setting {name} must be at least 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise InputError(f"setting temperature must be positive, got {self.temperature}")
        check_moves(self.moves, DATED_MOVES)

    @property
    def batch(self) -> int:
        """Chains on the device: `heats` per run, run-major."""
        return self.chains * self.heats

    @property
    def tune_generations(self) -> int:
        return self.generations // 10 if self.tune is None else int(self.tune)

    def program(self) -> "DatedSettings":
        """The settings the device program depends on (not the run's or the tuning's length)."""
        return replace(self, generations=1, tune=0)

    def weights(self) -> Float[Array, " moves"]:
        return jnp.asarray([dict(self.moves).get(name, 0.0) for name in DATED_MOVES])


class TimeTreePosition(eqx.Module):
    """Every chain's time tree and parameters, `[B]` leading."""

    parents: jax.Array  # [B, M]
    heights: jax.Array  # [B, M]
    params: dict  # unconstrained, [B, ...] each


class DatedPosterior(eqx.Module):
    """The log posterior of time trees: data, model, tip heights, clock and tree prior."""

    data: object
    coordinates: ModelCoordinates
    tip_heights: jax.Array  # [N] the start's (fixed tips stay there)
    free_tips: jax.Array  # [F] tips whose heights are sampled, uniform within `tip_bounds` [2, F]
    tip_bounds: jax.Array
    widths: tuple = eqx.field(static=True)
    dtype: object = eqx.field(static=True)
    num_tips: int = eqx.field(static=True)
    clock: str = eqx.field(static=True)  # "strict", "relaxed", or "none" (undated: rate 1)
    tree_prior: str = eqx.field(static=True)  # "coalescent", "exponential", "skygrid", "yule" or "birth-death"
    grid: tuple = eqx.field(static=True, default=())  # skygrid grid points
    population_size: float | None = eqx.field(static=True, default=None)  # fixed (else a parameter)
    priors: object = None
    prior_only: bool = eqx.field(static=True, default=False)
    fixed: tuple = eqx.field(static=True, default=())  # (name, unconstrained value): tree-prior rates held fixed
    growth_rate_scale: float = eqx.field(static=True, default=1.0)  # Laplace(0, scale) on the growth rate
    incremental: bool = eqx.field(static=True, default=True)  # keep every chain's partials (one `Model` only)

    @property
    def keeps_partials(self) -> bool:
        return self.incremental and not self.prior_only and isinstance(self.coordinates.template, Model)

    def _models(self, params):
        model = params.get("model", {})
        has_params = bool(jax.tree.leaves(model))
        return (jax.vmap(self.coordinates.model)(model) if has_params else self.coordinates.template), has_params

    def _kernel_tree(self, position: TimeTreePosition):
        lengths = self.branch_lengths(position.parents, position.heights, position.params)
        return position.parents, jnp.broadcast_to(lengths, position.parents.shape)

    def first_score(self, position: TimeTreePosition):
        """`(log L, log prior, partials)` of the chains' first positions (every node computed)."""
        if not self.keeps_partials:
            return (*self.log_posteriors_at(position), ())
        log_likelihood, partials = base.first_partials(*self._models(position.params), self._kernel_tree(position),
                                                       self.data, self.dtype)
        return log_likelihood, self.log_priors(position.parents, position.heights, position.params), partials

    def score(self, state: MCMCState, position: TimeTreePosition):
        """`(log L, log prior, partials)` of proposals: a node's partials are recomputed only where its subtree's
        topology or an edge length below it changed (a height move touches its node's edges; a clock-rate or
        model move, every edge)."""
        if not self.keeps_partials:
            return (*self.log_posteriors_at(position), ())
        at = state.position
        log_likelihood, partials = base.proposed_log_likelihoods(
            state.cache, *self._models(position.params), self._kernel_tree(position), self._kernel_tree(at),
            position.params.get("model", {}), at.params.get("model", {}), self.data, self.dtype)
        return log_likelihood, self.log_priors(position.parents, position.heights, position.params), partials

    def keep(self, partials, proposed, accept):
        return accept_partials(partials, proposed, accept) if self.keeps_partials else partials

    def branch_rates(self, params) -> Float[Array, "B M"] | Float[Array, "B 1"]:
        if self.clock == "none":
            return jnp.ones((1, 1), self.dtype)
        rate = jnp.exp(params["log_clock_rate"])[:, None]
        if self.clock == "strict":
            return rate
        spread = jnp.exp(params["log_rate_spread"])[:, None]
        return rate * jnp.exp(spread * params["rate_z"] - spread**2 / 2)

    def branch_lengths(self, parents, heights, params) -> Float[Array, "B M"]:
        return self.branch_rates(params) * _durations(parents, heights)

    def log_likelihoods(self, parents, heights, params) -> Float[Array, " B"]:
        if self.prior_only:
            return jnp.zeros(parents.shape[0], heights.dtype)
        has_params = bool(jax.tree.leaves(params.get("model", {})))
        models = jax.vmap(self.coordinates.model)(params["model"]) if has_params else self.coordinates.template
        per = batch_pattern_log_likelihoods(models, parents, self.branch_lengths(parents, heights, params),
                                             self.data, self.widths, self.dtype, per_tree_models=has_params)
        return jnp.sum(self.data.weights * per, axis=-1)

    def log_priors(self, parents, heights, params) -> Float[Array, " B"]:
        total = jax.vmap(self._tree_prior)(heights, params)
        if self.clock != "none":
            durations = jnp.sum(_durations(parents, heights), axis=-1)
            log_rate = params["log_clock_rate"]  # Gamma(1/2, sum durations) in log coordinates
            total += 0.5 * jnp.log(durations) - gammaln(0.5) + 0.5 * log_rate - durations * jnp.exp(log_rate)
        if self.clock == "relaxed":
            log_s = params["log_rate_spread"]
            total += jnp.log(RATE_SPREAD_PRIOR) - RATE_SPREAD_PRIOR * jnp.exp(log_s) + log_s
            z = jnp.where(parents >= 0, params["rate_z"], 0.0)
            total += -0.5 * jnp.sum(z**2, -1) - 0.5 * np.log(2 * np.pi) * (parents.shape[1] - 1)
        if jax.tree.leaves(params.get("model", {})):
            args = (self.coordinates.template, self.coordinates.estimated, self.priors)
            total -= jax.vmap(lambda u: potential_energy(sample_model, args, {}, u))(params["model"])
        return total

    def _tree_prior(self, heights, params):
        """The tree prior's density of one chain's heights, plus its hyperparameters' priors (unconstrained)."""
        if self.tree_prior in SPECIATION_PRIORS:
            return self._speciation_prior(heights, params)
        if self.tree_prior == "coalescent":
            log_size = jnp.log(self.population_size) if self.population_size else params["log_population_size"]
            return coalescent_times_log_density(heights, self.num_tips, log_size[None])  # 1/N: flat in log N
        if self.tree_prior == "exponential":  # 1/N0: flat in log N0; Laplace(0, scale) on a sampled growth rate
            growth, scale = self._rate(params, "growth_rate"), self.growth_rate_scale
            density = exponential_coalescent_times_log_density(heights, self.num_tips,
                                                               self._rate(params, "log_population_size"), growth)
            fixed = "growth_rate" in dict(self.fixed)
            return density if fixed else density - jnp.abs(growth) / scale - np.log(2 * scale)
        log_precision = self._rate(params, "log_skygrid_precision")
        precision = jnp.exp(log_precision)
        steps = params["skygrid_steps"]
        sizes = params["skygrid_first"] + jnp.concatenate([jnp.zeros(1), jnp.cumsum(steps)]) / jnp.sqrt(precision)
        log_gamma = 0.0 if "log_skygrid_precision" in dict(self.fixed) else (  # Gamma(0.001, 0.001), log Jacobian
            0.001 * jnp.log(0.001) - gammaln(0.001) + 0.001 * log_precision - 0.001 * precision)
        return (coalescent_times_log_density(heights, self.num_tips, sizes, self.grid) + log_gamma
                - 0.5 * jnp.sum(steps**2) - 0.5 * np.log(2 * np.pi) * steps.shape[0])

    def _speciation_prior(self, heights, params):
        """Yule or birth–death on one chain's labelled history (tips all at `heights[0]`), and the rates' priors
        in their coordinates: 1/x on the birth rate or `r = lambda - mu` is flat in its log; Uniform(0, 1) on
        the turnover `a = mu / lambda` has density `a (1 - a)` in `logit a`. `lambda = r / (1 - a)`."""
        ages = heights - heights[0]
        if self.tree_prior == "yule":
            birth = jnp.exp(self._rate(params, "log_birth_rate"))
            return birth_death_times_log_density(ages, self.num_tips, birth)
        logit_turnover = self._rate(params, "logit_turnover")
        net, turnover = jnp.exp(self._rate(params, "log_net_diversification")), jax.nn.sigmoid(logit_turnover)
        density = birth_death_times_log_density(ages, self.num_tips, net / (1 - turnover),
                                                net * turnover / (1 - turnover))
        return density + jax.nn.log_sigmoid(logit_turnover) + jax.nn.log_sigmoid(-logit_turnover)

    def _rate(self, params, name):
        """A tree-prior rate in its unconstrained coordinate: held at its `fixed` value, else sampled."""
        fixed = dict(self.fixed)
        return jnp.asarray(fixed[name], self.dtype) if name in fixed else params[name]

    def log_posteriors(self, parents, heights, params):
        return self.log_likelihoods(parents, heights, params), self.log_priors(parents, heights, params)

    def log_posteriors_at(self, position: TimeTreePosition):
        return self.log_posteriors(position.parents, position.heights, position.params)


def _durations(parents, heights) -> Float[Array, "B M"]:
    """Time along the branch above every node (0 for the root)."""
    above = jnp.take_along_axis(heights, jnp.maximum(parents, 0), axis=-1)
    return jnp.where(parents >= 0, above - heights, 0.0)


def hmc_move(key, state: MCMCState, posterior: DatedPosterior, settings: DatedSettings, tune_generations, beta=1.0):
    """Every chain's HMC proposal over node heights (ratio coordinates), sampled tip heights (logit within
    their bounds: the anchors move with them) and parameters: `(heights, params, log q, mass)`.

    A chain at inverse temperature `beta` follows its own heated target, `beta log posterior + log |dh/dz|`
    (the Jacobian is a change of coordinates, not heated), so hot chains keep HMC's acceptance.

    While tuning, every HMC move first adds the chain's current coordinates to
    its running variance (Welford) and sets the inverse mass to it, shrunk
    towards 1e-3 as Stan does, `(n / (n + 5)) var + 1e-3 (5 / (n + 5))`;
    after tuning the mass is fixed, so the kernel is a fixed HMC kernel.
    """
    n = posterior.num_tips
    at = state.position
    jacobian = jax.vmap(lambda p, a, h, z: ratio_log_jacobian_on(p, a, h, z, n))
    anchors_of = jax.vmap(anchors_on)
    internal = jnp.arange(at.parents.shape[1]) >= n
    low, high = posterior.tip_bounds

    def unpack(theta):
        z, tip_z, params = theta
        tips = at.heights[:, :n].at[:, posterior.free_tips].set(low + (high - low) * jax.nn.sigmoid(tip_z))
        anchors = anchors_of(at.parents, tips)
        heights = jax.vmap(lambda p, a, z: ratio_heights_on(p, a, z, n))(at.parents, anchors, z)
        tip_jacobian = jnp.sum(jnp.log(high - low) + jax.nn.log_sigmoid(tip_z) + jax.nn.log_sigmoid(-tip_z), -1)
        return heights, params, jacobian(at.parents, anchors, heights, z) + tip_jacobian

    def log_target(theta):
        heights, params, log_jacobian = unpack(theta)
        return beta * sum(posterior.log_posteriors(at.parents, heights, params)) + log_jacobian

    anchors = anchors_of(at.parents, at.heights[:, :n])
    z = jax.vmap(lambda p, a, h: ratio_coordinates_on(p, a, h, n))(at.parents, anchors, at.heights)
    free = at.heights[:, posterior.free_tips]
    theta = (z, jax.scipy.special.logit((free - low) / (high - low)), at.params)
    mass = _adapted_mass(state.adaptation, theta, settings.adapt_mass & (state.generation < tune_generations))
    new_theta, log_q = leapfrog_trajectory(chain_keys(key, state.chain), log_target, theta, (internal, None, None), state.tunings[:, 2],
                                           settings.hmc_steps, inverse_mass=mass[3])
    heights, params, new_jacobian = unpack(new_theta)
    log_q += new_jacobian - unpack(theta)[2]
    return heights, params, jnp.where(jnp.isfinite(log_q), log_q, -jnp.inf), mass


def _adapted_mass(mass, theta, tuning):
    """One Welford step of every chain's coordinates and the regularised variance as inverse mass (while
    `tuning`; from 10 visits on)."""
    count, mean, squares, inverse = mass
    new_count = count + 1
    per_chain = lambda x: new_count.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)  # noqa: E731
    delta = jax.tree.map(lambda x, m: x - m, theta, mean)
    new_mean = jax.tree.map(lambda m, d: m + d / per_chain(d), mean, delta)
    new_squares = jax.tree.map(lambda q, x, m, d: q + d * (x - m), squares, theta, new_mean, delta)

    def regularised(q):
        c = per_chain(q)
        return jnp.where(c >= 10, c / (c + 5) * q / jnp.maximum(c - 1, 1) + 1e-3 * 5 / (c + 5), 1.0)

    new_inverse = jax.tree.map(regularised, new_squares)
    adapted = (new_count, new_mean, new_squares, new_inverse)
    return jax.tree.map(lambda a, b: jnp.where(tuning, a, b), adapted, mass)


def _mass_start(theta_like):
    """No visits yet: unit inverse mass."""
    zeros = jax.tree.map(jnp.zeros_like, theta_like)
    b = jax.tree.leaves(theta_like)[0].shape[0]
    return (jnp.zeros(b, jnp.int32), zeros, zeros, jax.tree.map(jnp.ones_like, theta_like))


def _propose(posterior: DatedPosterior, settings: DatedSettings, tune_generations):
    """Every chain's proposal: a tree move each (drawn with the weights of `settings.moves`), or, with
    probability `weights["hmc"] / sum(weights)` (one draw for all chains), HMC for all."""
    weights = settings.weights()
    hmc = DATED_MOVES.index("hmc")
    enabled = tuple(dict(settings.moves).get(name, 0.0) > 0 for name in TIME_TREE_MOVES)
    hmc_enabled = dict(settings.moves).get("hmc", 0.0) > 0

    def propose(key, state: MCMCState, beta) -> Proposal:
        at = state.position
        k_kind, k_move, k_hmc_pick, k_hmc = jax.random.split(key, 4)
        kind, use_hmc = draw_moves(k_kind, k_hmc_pick, weights, hmc, state.chain)

        def tree_moves(_):
            parents, heights, log_q = jax.vmap(propose_time_tree, in_axes=(0, 0, 0, 0, 0, None))(
                kind, chain_keys(k_move, state.chain), at.parents, at.heights, state.tunings[:, :2], enabled)
            return TimeTreePosition(parents.astype(at.parents.dtype), heights, at.params), log_q, state.adaptation

        def hamiltonian(_):
            heights, params, log_q, mass = hmc_move(k_hmc, state, posterior, settings, tune_generations, beta)
            return TimeTreePosition(at.parents, heights, params), log_q, mass

        position, log_q, mass = mixture(use_hmc, hmc_enabled, hamiltonian, tree_moves)
        kind = jnp.where(use_hmc, hmc, kind)
        return Proposal(position, log_q, kind, _tuning_column(kind), mass)

    return propose


def _tuning_column(kind):
    """The column of `tunings` the move used: subtree slide's window, the root multiplier's lambda, HMC's step
    (-1: none)."""
    return jnp.select([kind == DATED_MOVES.index(name) for name in TUNED] + [kind == DATED_MOVES.index("hmc")],
                      list(TUNED.values()) + [2], -1)


def _target_acceptance(column):
    return jnp.where(column == 2, HMC_TARGET_ACCEPTANCE, TARGET_ACCEPTANCE)


def build_kernel(posterior: DatedPosterior, settings: DatedSettings, tune_generations):
    """`step(key, state) -> (state, info)` over a `tempered.TemperedState`: one generation of every chain
    (`base.build_kernel` with BEAST's tree operators and HMC as proposals, tunings within `[1e-6, 1e6]`) at its
    heat, then a heat swap in every run of `settings.heats` chains (`tempered.tempered`; none when unheated)."""
    step = base.build_kernel(_propose(posterior, settings, tune_generations), posterior.score, _target_acceptance,
                             tune_generations, (1e-6, 1e6), posterior.keep)
    return tempered.tempered(step, settings.heats, settings.temperature)


class DatedSample(eqx.Module):
    """Every run's cold chain at one sampled generation (`[runs, ...]`)."""

    parents: jax.Array
    heights: jax.Array
    rates: jax.Array  # [B, M] each branch's clock rate (1 undated)
    params: dict
    log_likelihood: jax.Array
    log_prior: jax.Array


@eqx.filter_jit
def run_block(state: tempered.TemperedState, key, posterior: DatedPosterior, settings: DatedSettings, count,
              tune_generations):
    """`count` (<= `settings.block`) samples of `sample_every` generations, `count` and `tune_generations`
    traced; returns `(state, key, the cold chains' samples [block, runs, ...])`."""

    def observe(state: tempered.TemperedState) -> DatedSample:
        pick, chains = tempered.cold(state, settings.heats), state.chains
        at = jax.tree.map(pick, chains.position)
        rates = jnp.broadcast_to(posterior.branch_rates(at.params), at.heights.shape)
        return DatedSample(at.parents, at.heights, rates, at.params, pick(chains.log_likelihood),
                           pick(chains.log_prior))

    return base.sample_blocks(build_kernel(posterior, settings, tune_generations), state, key, count,
                              settings.block, settings.sample_every, observe)


def without_partials(state: tempered.TemperedState) -> tempered.TemperedState:
    """The state a checkpoint keeps: no partials (`with_partials` computes them again, to the same bits)."""
    return eqx.tree_at(lambda s: s.chains.cache, state, ())


@eqx.filter_jit
def with_partials(state: tempered.TemperedState, posterior: DatedPosterior) -> tempered.TemperedState:
    return eqx.tree_at(lambda s: s.chains.cache, state, posterior.first_score(state.chains.position)[2])


@eqx.filter_jit  # one program: run eagerly, its operations were ~100 programs to trace and load
def init(parents, heights, params: dict, posterior: DatedPosterior, heats: int = 1) -> tempered.TemperedState:
    """Chains started from time trees `parents [B, M]`, `heights [B, M]` and unconstrained `params` `[B, ...]`,
    run-major: `B / heats` runs of `heats` chains, heat `k` on chain `k` of every run."""
    parents, heights = jnp.asarray(parents, jnp.int32), jnp.asarray(heights, posterior.dtype)
    b = parents.shape[0]
    root_height = jnp.max(heights, axis=1) - jnp.min(heights, axis=1)
    tunings = jnp.stack([START_SLIDE * root_height, jnp.full(b, ROOT_TUNING), jnp.full(b, HMC_START_STEP)], axis=1)
    theta_like = (heights, jnp.zeros((b, posterior.free_tips.shape[0]), heights.dtype), params)
    chains = base.init(TimeTreePosition(parents, heights, params), posterior.first_score,
                       tunings.astype(posterior.dtype), _mass_start(theta_like), len(DATED_MOVES))
    return tempered.init(chains, b // heats, heats)
