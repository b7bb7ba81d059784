"""Metropolis-coupled MCMC over unrooted trees: every chain of every run advanced together on the device.

The state of all `runs x chains` chains is one batch (`ChainState`): topology
(`up`, the tip-0 view of `_tree_moves`), edge lengths, unconstrained model
parameters, log-likelihood, log-prior and the heat each chain runs at. One
generation proposes one move for every chain (a topology move, a branch-length
move or a model-parameter move, drawn with `MC3Settings.moves` weights),
evaluates every proposed tree in one batched likelihood call, accepts or
rejects each at its chain's inverse temperature `beta = 1 / (1 + lambda h)`
(`h` = 0 for the cold chain; MrBayes heats prior and likelihood together), and
then, in every run, proposes to swap the heats of two random chains `i`, `j`,
accepted with probability `min(1, exp((beta_i - beta_j)(P_j - P_i)))`, `P`
the log posterior. `lax.scan` runs blocks of generations; only the cold
chain of each run leaves the device, every `sample_every` generations.

Priors (MrBayes's defaults for unrooted trees): uniform topology, edge
lengths i.i.d. Exponential(10), and the model parameters' priors of `sample`
(`inference._model_priors`: Dirichlet(1, ...) frequencies and
exchangeabilities, Exponential(1) Gamma shape, Uniform(0, 1) +I, ...), any of
them replaced through `priors={name: distribution}`.

Model parameters move by a random walk on one unconstrained coordinate at a
time (`u_k + sigma N(0, 1)`: symmetric, `log q = 0`; the prior density in
unconstrained coordinates includes the bijection's Jacobian). The
multipliers' `lambda` and the walk's `sigma` are tuned per chain towards
acceptance 0.3 during the first `tune` generations, then frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import potential_energy

from .._errors import InputError
from ..likelihood._api import _batch_pattern_log_likelihoods
from ..ml._parameters import ModelCoordinates
from ._model_priors import sample_model
from ._tree_moves import BRANCH_MOVES, MULTIPLIER_TUNING, TOPOLOGY_MOVES, from_view, propose_tree, to_view

MOVES = TOPOLOGY_MOVES + BRANCH_MOVES + ("parameters",)
DEFAULT_MOVES = {"nni": 5.0, "spr": 5.0, "branch_multiplier": 5.0, "tree_length": 1.0, "node_slider": 2.0,
                 "parameters": 2.0}
BRANCH_RATE = 10.0  # MrBayes's brlenspr = unconstrained:exponential(10)
TARGET_ACCEPTANCE = 0.3


@dataclass(frozen=True)
class MC3Settings:
    runs: int = 2
    chains: int = 4
    generations: int = 100_000
    sample_every: int = 100
    temperature: float = 0.1  # lambda of beta_i = 1 / (1 + lambda i)
    stop_asdsf: float | None = None
    burnin: float = 0.25  # fraction of each run's samples discarded (ASDSF, consensus, splits)
    min_split_frequency: float = 0.1  # splits below it in every run are left out of ASDSF (MrBayes's minpartfreq)
    tune: int | None = None  # generations of tuning (default a tenth of `generations`)
    block: int = 50  # samples per device call (a checkpoint after each)
    moves: tuple = tuple(DEFAULT_MOVES.items())  # (name, weight) pairs; a dict is accepted

    def __post_init__(self):
        object.__setattr__(self, "moves", tuple(dict(self.moves).items()))  # hashable: a static argument
        for name in ("runs", "chains", "generations", "sample_every", "block"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"mcmc setting {name} must be at least 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise InputError(f"--temperature must not be negative, got {self.temperature}")
        if not 0 <= self.burnin < 1:
            raise InputError(f"burn-in must be in [0, 1), got {self.burnin}")
        if unknown := sorted(set(dict(self.moves)) - set(MOVES)):
            raise InputError(f"unknown move {unknown[0]!r}: moves are {', '.join(MOVES)}")
        if any(w < 0 for _, w in self.moves) or sum(w for _, w in self.moves) <= 0:
            raise InputError("move weights must be non-negative and not all zero")

    @property
    def tune_generations(self) -> int:
        return self.generations // 10 if self.tune is None else int(self.tune)


class ChainState(eqx.Module):
    """Every chain's state, `[B]` leading (`B = runs x chains`, run-major)."""

    up: jax.Array  # [B, M] tip-0 view
    edge: jax.Array  # [B, M]
    root: jax.Array  # [B] the kernel root's id
    params: dict  # unconstrained model parameters, [B, ...] each
    log_likelihood: jax.Array  # [B]
    log_prior: jax.Array  # [B]
    heat: jax.Array  # [B] heat index within the run: 0 is the cold chain
    tunings: jax.Array  # [B, 4]: lambda of the three branch moves, sigma of the parameter walk
    proposed: jax.Array  # [B, moves] counts, for acceptance rates
    accepted: jax.Array  # [B, moves]
    swaps_tried: jax.Array  # [runs, chains, chains] by heat index
    swaps_accepted: jax.Array
    generation: jax.Array  # [] generations done
    key: jax.Array


class Posterior(eqx.Module):
    """The log posterior's parts for a batch of chains: data, model template, priors, likelihood layout."""

    data: object
    coordinates: ModelCoordinates
    widths: tuple = eqx.field(static=True)
    dtype: object = eqx.field(static=True)
    num_tips: int = eqx.field(static=True)
    priors: object = None  # {name: distribution} (distributions are pytrees)
    prior_only: bool = eqx.field(static=True, default=False)

    def log_likelihoods(self, up, edge, root, params):
        if self.prior_only:
            return jnp.zeros(up.shape[0])
        parents, lengths = jax.vmap(from_view)(up, edge, root)
        has_params = bool(jax.tree.leaves(params))
        models = jax.vmap(self.coordinates.model)(params) if has_params else self.coordinates.template
        per = _batch_pattern_log_likelihoods(models, parents, lengths, self.data, self.widths, self.dtype,
                                             per_tree_models=has_params)
        return jnp.sum(self.data.weights * per, axis=-1)

    def log_priors(self, up, edge, params):
        """Exponential(10) on each of the 2N - 3 edges (the uniform topology prior is a constant), plus the
        model parameters' priors in unconstrained coordinates (Jacobian included)."""
        lengths = jnp.where(up >= 0, jnp.log(BRANCH_RATE) - BRANCH_RATE * edge, 0.0).sum(-1)
        if not jax.tree.leaves(params):
            return lengths
        model_args = (self.coordinates.template, self.coordinates.estimated, self.priors)
        return lengths - jax.vmap(lambda u: potential_energy(sample_model, model_args, {}, u))(params)


def heats(settings: MC3Settings) -> jax.Array:
    return 1.0 / (1.0 + settings.temperature * jnp.arange(settings.chains))


def _propose_parameters(key, params, sigma):
    """One unconstrained coordinate, uniformly chosen, moved by `sigma N(0, 1)` (symmetric: log q = 0)."""
    flat, unravel = ravel_pytree(params)
    if flat.size == 0:
        return params
    k1, k2 = jax.random.split(key)
    j = jax.random.randint(k1, (), 0, flat.size)
    return unravel(flat.at[j].add(sigma * jax.random.normal(k2, dtype=flat.dtype)))


def generation(state: ChainState, posterior: Posterior, settings: MC3Settings, weights: jax.Array) -> ChainState:
    """One generation of every chain: a move each, one batched likelihood, Metropolis-Hastings, heat swaps."""
    b = state.up.shape[0]
    key, k_kind, k_move, k_param, k_accept, k_swap = jax.random.split(state.key, 6)
    kind = jax.random.categorical(k_kind, jnp.log(weights), shape=(b,))
    tree_kind = jnp.minimum(kind, len(TOPOLOGY_MOVES + BRANCH_MOVES) - 1)
    up, edge, log_q = jax.vmap(propose_tree, in_axes=(0, 0, 0, 0, None, 0))(
        tree_kind, jax.random.split(k_move, b), state.up, state.edge, posterior.num_tips, state.tunings[:, :3])
    moving_params = kind == len(MOVES) - 1
    walked = jax.vmap(_propose_parameters)(jax.random.split(k_param, b), state.params, state.tunings[:, 3])
    keep = lambda new, old: jnp.where(moving_params.reshape((-1,) + (1,) * (new.ndim - 1)), old, new)  # noqa: E731
    up, edge = keep(up.astype(state.up.dtype), state.up), keep(edge, state.edge)
    log_q = jnp.where(moving_params, 0.0, log_q)
    params = jax.tree.map(lambda new, old: jnp.where(moving_params.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
                          walked, state.params)

    log_likelihood = posterior.log_likelihoods(up, edge, state.root, params)
    log_prior = posterior.log_priors(up, edge, params)
    beta = heats(settings)[state.heat]
    log_ratio = beta * (log_likelihood - state.log_likelihood + log_prior - state.log_prior) + log_q
    accept = (jnp.log(jax.random.uniform(k_accept, (b,))) < log_ratio) & jnp.isfinite(log_likelihood + log_prior)

    take = lambda new, old: jnp.where(accept.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)  # noqa: E731
    chosen = jax.nn.one_hot(kind, len(MOVES), dtype=jnp.int32)
    state = eqx.tree_at(
        lambda s: (s.up, s.edge, s.params, s.log_likelihood, s.log_prior, s.proposed, s.accepted, s.tunings, s.key),
        state,
        (take(up, state.up), take(edge, state.edge), jax.tree.map(take, params, state.params),
         take(log_likelihood, state.log_likelihood), take(log_prior, state.log_prior),
         state.proposed + chosen, state.accepted + chosen * accept[:, None],
         _tuned(state, kind, accept, settings), key))
    state = _swap_heats(state, k_swap, settings)
    return eqx.tree_at(lambda s: s.generation, state, state.generation + 1)


def _tuned(state: ChainState, kind, accept, settings: MC3Settings):
    """Robbins-Monro steps on the log of the used move's tuning, towards `TARGET_ACCEPTANCE`, while tuning."""
    slot = kind - len(TOPOLOGY_MOVES)
    tunable = (slot >= 0) & (state.generation < settings.tune_generations)
    step = (accept.astype(state.tunings.dtype) - TARGET_ACCEPTANCE) / jnp.sqrt(1.0 + state.generation / 100.0)
    change = jax.nn.one_hot(jnp.maximum(slot, 0), 4) * jnp.where(tunable, step, 0.0)[:, None]
    return jnp.clip(state.tunings * jnp.exp(change), 1e-3, 20.0)


def _swap_heats(state: ChainState, key, settings: MC3Settings) -> ChainState:
    """In every run, two random chains propose to exchange heats."""
    runs, chains = settings.runs, settings.chains
    if chains < 2:
        return state
    k1, k2, k3 = jax.random.split(key, 3)
    i = jax.random.randint(k1, (runs,), 0, chains)
    j = (i + 1 + jax.random.randint(k2, (runs,), 0, chains - 1)) % chains
    heat = state.heat.reshape(runs, chains)
    log_post = (state.log_likelihood + state.log_prior).reshape(runs, chains)
    rows = jnp.arange(runs)
    hi, hj = heat[rows, i], heat[rows, j]
    beta = heats(settings)
    log_ratio = (beta[hi] - beta[hj]) * (log_post[rows, j] - log_post[rows, i])
    accept = jnp.log(jax.random.uniform(k3, (runs,))) < log_ratio
    heat = heat.at[rows, i].set(jnp.where(accept, hj, hi)).at[rows, j].set(jnp.where(accept, hi, hj))
    low, high = jnp.minimum(hi, hj), jnp.maximum(hi, hj)
    return eqx.tree_at(lambda s: (s.heat, s.swaps_tried, s.swaps_accepted), state,
                       (heat.reshape(-1), state.swaps_tried.at[rows, low, high].add(1),
                        state.swaps_accepted.at[rows, low, high].add(accept.astype(jnp.int32))))


class Sample(eqx.Module):
    """The cold chain of every run at one sampled generation (`[runs, ...]`)."""

    parents: jax.Array
    lengths: jax.Array
    params: dict
    log_likelihood: jax.Array
    log_prior: jax.Array


def cold_chains(state: ChainState, settings: MC3Settings) -> Sample:
    shaped = lambda x: x.reshape((settings.runs, settings.chains) + x.shape[1:])  # noqa: E731
    cold = jnp.argmin(shaped(state.heat), axis=1)
    pick = lambda x: jnp.take_along_axis(shaped(x), cold.reshape((-1, 1) + (1,) * (x.ndim - 1)), axis=1)[:, 0]  # noqa
    parents, lengths = jax.vmap(from_view)(pick(state.up), pick(state.edge), pick(state.root))
    return Sample(parents, lengths, jax.tree.map(pick, state.params), pick(state.log_likelihood),
                  pick(state.log_prior))


@eqx.filter_jit
def run_block(state: ChainState, posterior: Posterior, settings: MC3Settings, count):
    """`count` (<= `settings.block`, a traced number: one program) samples of `sample_every` generations each;
    the cold chains at each sample (`[block, runs, ...]`; rows past `count` repeat the last state)."""
    weights = jnp.asarray([dict(settings.moves).get(name, 0.0) for name in MOVES])
    if not jax.tree.leaves(state.params):
        weights = weights.at[-1].set(0.0)  # nothing to move

    def sampled(state, i):
        steps = jnp.where(i < count, settings.sample_every, 0)
        state = jax.lax.fori_loop(0, steps, lambda _, s: generation(s, posterior, settings, weights), state)
        return state, cold_chains(state, settings)

    return jax.lax.scan(sampled, state, jnp.arange(settings.block))


def initial_state(trees, params, posterior: Posterior, settings: MC3Settings, seed: int) -> ChainState:
    """Chains started from kernel trees `(parents [B, M], lengths [B, M])` and parameters `[B, ...]`."""
    parents, lengths = trees
    up, edge = jax.vmap(to_view)(jnp.asarray(parents, jnp.int32), jnp.asarray(lengths))
    root = jnp.argmin(jnp.asarray(parents), axis=1).astype(jnp.int32)
    b = parents.shape[0]
    tunings = jnp.broadcast_to(jnp.asarray([MULTIPLIER_TUNING, MULTIPLIER_TUNING, MULTIPLIER_TUNING, 0.2]), (b, 4))
    zeros = jnp.zeros((b, len(MOVES)), jnp.int32)
    swaps = jnp.zeros((settings.runs, settings.chains, settings.chains), jnp.int32)
    return ChainState(up, edge, root, params, posterior.log_likelihoods(up, edge, root, params),
                      posterior.log_priors(up, edge, params), jnp.tile(jnp.arange(settings.chains), settings.runs),
                      tunings, zeros, zeros, swaps, swaps, jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed))


def state_to_numpy(state: ChainState) -> dict:
    leaves, _ = jax.tree.flatten(state)
    return {"leaves": [np.asarray(x) for x in leaves]}


def state_from_numpy(saved: dict, like: ChainState) -> ChainState:
    return jax.tree.unflatten(jax.tree.structure(like), [jnp.asarray(x) for x in saved["leaves"]])
