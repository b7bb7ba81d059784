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
lengths i.i.d. Exponential(10) (`branch_rate`), and the model parameters' priors of `sample`
(`inference._model_priors`: Dirichlet(1, ...) frequencies and
exchangeabilities, Exponential(1) Gamma shape, Uniform(0, 1) +I, ...), any of
them replaced through `priors={name: distribution}`.

Moves (weights in `MC3Settings.moves`, defaults `DEFAULT_MOVES`): topology
moves (stochastic NNI, uniform SPR, MrBayes's extending SPR and TBR) and
branch-length moves (multiplier, tree-length multiplier, node slider) in
`_tree_moves`; one model parameter at a time by MrBayes's moves for its kind
(Dirichlet for simplexes, multiplier for positive values, sliding window for
proportions) in `_parameter_moves`; and `hmc`, what MrBayes lacks: every edge
length and parameter of every chain moved along the likelihood's gradient
(`_hmc_move`, off by default; see the README for what it does to mixing).
Every tuning (multipliers' `lambda`, Dirichlet's `1/alpha`, windows, HMC's
step) is tuned per chain towards acceptance 0.3 (HMC 0.65) during the first
`tune` generations, then frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from numpyro.infer.util import potential_energy

from ..._errors import InputError
from ...likelihood import batch_pattern_log_likelihoods
from ...models import ModelCoordinates, sample_model
from ..base import check_moves, draw_moves, metropolis_hastings, mixture, robbins_monro, tally, where
from ..moves import (
    BRANCH_MOVES, HMC_START_STEP, HMC_STEPS, HMC_TARGET_ACCEPTANCE, MULTIPLIER_TUNING, START_TUNING, TOPOLOGY_MOVES, from_view, hmc_proposal, propose_parameters, propose_tree, support_kind, to_view,
)

MOVES = TOPOLOGY_MOVES + BRANCH_MOVES + ("parameters", "hmc")
DEFAULT_MOVES = {"nni": 3.0, "spr": 2.0, "espr": 3.0, "etbr": 3.0, "branch_multiplier": 5.0, "tree_length": 1.0,
                 "node_slider": 2.0, "parameters": 2.0, "hmc": 0.0}
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
    hmc_steps: int = HMC_STEPS  # leapfrog steps of an HMC move
    branch_rate: float = 10.0  # edge lengths ~ Exponential(rate): MrBayes's brlenspr = unconstrained:exponential(10)

    def __post_init__(self):
        object.__setattr__(self, "moves", tuple(dict(self.moves).items()))  # hashable: a static argument
        for name in ("runs", "chains", "generations", "sample_every", "block", "hmc_steps"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"mcmc setting {name} must be at least 1, got {getattr(self, name)}")
        if not self.branch_rate > 0:
            raise InputError(f"--branch-rate must be positive, got {self.branch_rate}")
        if self.temperature < 0:
            raise InputError(f"--temperature must not be negative, got {self.temperature}")
        if not 0 <= self.burnin < 1:
            raise InputError(f"burn-in must be in [0, 1), got {self.burnin}")
        check_moves(self.moves, MOVES)

    @property
    def tune_generations(self) -> int:
        return self.generations // 10 if self.tune is None else int(self.tune)


class ChainState(eqx.Module):
    """Every chain's state, `[B]` leading (`B = runs x chains`, run-major)."""

    up: jax.Array  # [B, M] tip-0 view
    edge: jax.Array  # [B, M], or [B, M, K] (every part's: unlinked partitions)
    root: jax.Array  # [B] the kernel root's id
    params: dict  # unconstrained model parameters, [B, ...] each
    log_likelihood: jax.Array  # [B]
    log_prior: jax.Array  # [B]
    heat: jax.Array  # [B] heat index within the run: 0 is the cold chain
    tunings: jax.Array  # [B, 4 + S]: the three branch moves', HMC's step size, each model parameter's move
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
    branch_rate: float = eqx.field(static=True, default=10.0)

    def log_likelihoods(self, up, edge, root, params):
        if self.prior_only:
            return jnp.zeros(up.shape[0])
        parents, lengths = jax.vmap(from_view)(up, edge, root)
        has_params = bool(jax.tree.leaves(params))
        models = jax.vmap(self.coordinates.model)(params) if has_params else self.coordinates.template
        per = batch_pattern_log_likelihoods(models, parents, lengths, self.data, self.widths, self.dtype,
                                             per_tree_models=has_params)
        return jnp.sum(self.data.weights * per, axis=-1)

    def supports(self) -> dict:
        return self.coordinates.supports(self.priors)

    def log_priors(self, up, edge, params):
        """Exponential(branch_rate) on each of the 2N - 3 edges (each part's, unlinked: i.i.d.; the uniform
        topology prior is a constant), plus the model parameters' priors in unconstrained coordinates (Jacobian
        included)."""
        valid = (up >= 0).reshape(up.shape + (1,) * (edge.ndim - 2))
        lengths = jnp.where(valid, jnp.log(self.branch_rate) - self.branch_rate * edge, 0.0)
        lengths = lengths.reshape(edge.shape[0], -1).sum(-1)
        if not jax.tree.leaves(params):
            return lengths
        model_args = (self.coordinates.template, self.coordinates.estimated, self.priors)
        return lengths - jax.vmap(lambda u: potential_energy(sample_model, model_args, {}, u))(params)


def heats(settings: MC3Settings) -> jax.Array:
    return 1.0 / (1.0 + settings.temperature * jnp.arange(settings.chains))


def _local_proposals(state: ChainState, posterior: Posterior, settings: MC3Settings, key, kind):
    """Each chain's own move: a tree move or one model parameter (`_parameter_moves`), chosen by `kind`.

    Returns `(up, edge, params, log q, slot)`, `slot` the column of `tunings`
    the move used (-1 for a topology move).
    """
    b = state.up.shape[0]
    k_tree, k_param = jax.random.split(key)
    tree_kind = jnp.minimum(kind, len(TOPOLOGY_MOVES + BRANCH_MOVES) - 1)
    weights = dict(settings.moves)
    enabled = tuple(weights.get(name, 0.0) > 0 for name in TOPOLOGY_MOVES + BRANCH_MOVES)
    up, edge, log_q = jax.vmap(propose_tree, in_axes=(0, 0, 0, 0, None, 0, None))(
        tree_kind, jax.random.split(k_tree, b), state.up, state.edge, posterior.num_tips, state.tunings[:, :3],
        enabled)
    moving_params = kind == MOVES.index("parameters")
    slot = jnp.where(kind >= len(TOPOLOGY_MOVES), kind - len(TOPOLOGY_MOVES), -1)
    params = state.params
    if jax.tree.leaves(state.params):
        walked, log_q_params, site = jax.vmap(propose_parameters, in_axes=(0, 0, None, 0))(
            jax.random.split(k_param, b), state.params, posterior.supports(), state.tunings[:, 4:])
        params = where(moving_params, walked, state.params)
        log_q = jnp.where(moving_params, log_q_params, log_q)
        slot = jnp.where(moving_params, 4 + site, slot)
    up, edge = where(moving_params, (state.up, state.edge), (up.astype(state.up.dtype), edge))
    return up, edge, params, log_q, slot


def generation(state: ChainState, posterior: Posterior, settings: MC3Settings, weights: jax.Array) -> ChainState:
    """One generation of every chain: a move each, one batched likelihood, Metropolis-Hastings, heat swaps.

    With probability `weights[hmc] / sum(weights)` (one draw for all chains)
    the generation is an HMC move of every chain instead (`_hmc_move`);
    otherwise each chain draws its own move from the other weights.
    """
    b = state.up.shape[0]
    key, k_kind, k_move, k_hmc_pick, k_hmc, k_accept, k_swap = jax.random.split(state.key, 7)
    hmc = MOVES.index("hmc")
    kind, use_hmc = draw_moves(k_kind, k_hmc_pick, weights, hmc, b)
    beta = heats(settings)[state.heat]

    def hamiltonian(_):
        edge, params, log_q = hmc_proposal(k_hmc, posterior, state.up, state.edge, state.root, state.params, beta,
                                           state.tunings[:, 3], settings.hmc_steps)
        return state.up, edge, params, log_q, jnp.full(b, 3)

    local = lambda _: _local_proposals(state, posterior, settings, k_move, kind)  # noqa: E731
    hmc_enabled = dict(settings.moves).get("hmc", 0.0) > 0
    up, edge, params, log_q, slot = mixture(use_hmc, hmc_enabled, hamiltonian, local)
    kind = jnp.where(use_hmc, hmc, kind)

    log_likelihood = posterior.log_likelihoods(up, edge, state.root, params)
    log_prior = posterior.log_priors(up, edge, params)
    log_ratio = beta * (log_likelihood - state.log_likelihood + log_prior - state.log_prior) + log_q
    accept = metropolis_hastings(k_accept, log_ratio, log_likelihood + log_prior)
    kept = where(accept, (up, edge, params, log_likelihood, log_prior),
                  (state.up, state.edge, state.params, state.log_likelihood, state.log_prior))
    state = eqx.tree_at(
        lambda s: (s.up, s.edge, s.params, s.log_likelihood, s.log_prior, s.proposed, s.accepted, s.tunings, s.key),
        state, kept + tally(state.proposed, state.accepted, kind, accept) + (_tuned(state, slot, accept, settings), key))
    state = _swap_heats(state, k_swap, settings)
    return eqx.tree_at(lambda s: s.generation, state, state.generation + 1)


def _tuned(state: ChainState, slot, accept, settings: MC3Settings):
    """Robbins-Monro steps on the log of the used move's tuning (`slot`, -1 for none) towards its target
    acceptance (HMC's 0.65, else 0.3), while tuning."""
    target = jnp.where(slot == 3, HMC_TARGET_ACCEPTANCE, TARGET_ACCEPTANCE)
    return robbins_monro(state.tunings, slot, accept, target, state.generation, settings.tune_generations,
                         (1e-4, 20.0))


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
        weights = weights.at[MOVES.index("parameters")].set(0.0)  # nothing to move

    def sampled(state, i):
        steps = jnp.where(i < count, settings.sample_every, 0)
        state = jax.lax.fori_loop(0, steps, lambda _, s: generation(s, posterior, settings, weights), state)
        return state, cold_chains(state, settings)

    return jax.lax.scan(sampled, state, jnp.arange(settings.block))


def initial_state(trees, params, posterior: Posterior, settings: MC3Settings, seed: int) -> ChainState:
    """Chains started from kernel trees `(parents [B, M], lengths [B, M] or [B, M, K])` and parameters `[B, ...]`."""
    parents, lengths = trees
    up, edge = jax.vmap(to_view)(jnp.asarray(parents, jnp.int32), jnp.asarray(lengths))
    root = jnp.argmin(jnp.asarray(parents), axis=1).astype(jnp.int32)
    b = parents.shape[0]
    sites = [START_TUNING[support_kind(support)] for _, support in sorted(posterior.supports().items())]
    tunings = jnp.broadcast_to(jnp.asarray([MULTIPLIER_TUNING] * 3 + [HMC_START_STEP] + sites), (b, 4 + len(sites)))
    zeros = jnp.zeros((b, len(MOVES)), jnp.int32)
    swaps = jnp.zeros((settings.runs, settings.chains, settings.chains), jnp.int32)
    return ChainState(up, edge, root, params, posterior.log_likelihoods(up, edge, root, params),
                      posterior.log_priors(up, edge, params), jnp.tile(jnp.arange(settings.chains), settings.runs),
                      tunings, zeros, zeros, swaps, swaps, jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed))
