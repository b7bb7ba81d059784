"""Metropolis-coupled MCMC over unrooted trees: every chain of every run advanced together on the device.

Blackjax's shape: `init` gives the state of all `runs x chains` chains as one batch (a
`tempered.TemperedState` around a `base.MCMCState` whose position is `UnrootedPosition`: the tip-0 view
`up`, edge lengths, the kernel root, unconstrained model parameters), and `build_kernel` gives
`step(key, state) -> (state, info)`: the Metropolis–Hastings kernel of `base.py` with this sampler's
proposals (one move per chain, drawn with `MC3Settings.moves` weights, every proposed tree scored in one
batched likelihood call), wrapped by `tempered.tempered` (each chain at its heat's `beta = 1 / (1 + lambda h)`,
then a heat swap per run). `run_block` runs blocks of generations for the run's driver; only the cold chain
of each run leaves the device, every `sample_every` generations.

Priors (MrBayes's defaults for unrooted trees): uniform topology, edge
lengths i.i.d. Exponential(10) (`branch_rate`), and the model parameters' priors of `sample`
(`jaxphylo.models.sample_model`: Dirichlet(1, ...) frequencies and
exchangeabilities, Exponential(1) Gamma shape, Uniform(0, 1) +I, ...), any of
them replaced through `priors={name: distribution}`.

Moves (weights in `MC3Settings.moves`, defaults `DEFAULT_MOVES`): topology
moves (stochastic NNI, uniform SPR, MrBayes's extending SPR and TBR) and
branch-length moves (multiplier, tree-length multiplier, node slider) in
`moves/_unrooted.py`; one model parameter at a time by MrBayes's moves for its kind
(Dirichlet for simplexes, multiplier for positive values, sliding window for
proportions) in `moves/_parameters.py`; and `hmc`, what MrBayes lacks: every edge
length and parameter of every chain moved along the likelihood's gradient
(`moves/_hmc.py`, off by default; see the README for what it does to mixing).
Every tuning (multipliers' `lambda`, Dirichlet's `1/alpha`, windows, HMC's
step) is tuned per chain towards acceptance 0.3 (HMC 0.65) during the first
`tune` generations, then frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from numpyro.infer.util import potential_energy

from ..._errors import InputError
from ...likelihood import NodePartials, accept_partials, batch_pattern_log_likelihoods, kernels, spectral_arrays
from ...models import Model, ModelCoordinates, category_count, sample_model
from ...runtime import SHARE_TRACING, batch_specs, is_local, run_shares, shard_batch, splits_batch
from ...tree import from_view, to_view
from .. import base, tempered
from ..base import MCMCState, Proposal, chain_keys, check_moves, draw_moves, mixture, uniform_choice, where
from ..moves import (
    BRANCH_MOVES, HMC_START_STEP, HMC_STEPS, HMC_TARGET_ACCEPTANCE, MULTIPLIER_TUNING, START_TUNING, TOPOLOGY_MOVES, hmc_proposal, propose_parameters, propose_tree, support_kind,
)

MOVES = TOPOLOGY_MOVES + BRANCH_MOVES + ("parameters", "hmc")
DEFAULT_MOVES = {"nni": 3.0, "spr": 2.0, "espr": 3.0, "etbr": 3.0, "branch_multiplier": 5.0, "tree_length": 1.0,
                 "node_slider": 2.0, "parameters": 2.0, "hmc": 0.0}
TARGET_ACCEPTANCE = 0.3
FUSED_MOVES = ("branch_multiplier", "nni")  # what a fused generation draws from, by the moves' weights


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
    incremental: bool = True  # keep every chain's partials and recompute only what a move touched (False: all)
    fused_generations: int = 0  # after every generation, this many more of NNI and branch multiplier (tgMC³)

    def __post_init__(self):
        object.__setattr__(self, "moves", tuple(dict(self.moves).items()))  # hashable: a static argument
        if int(self.fused_generations) < 0:
            raise InputError(f"--fused-generations must not be negative, got {self.fused_generations}")
        if self.fused_generations and not any(dict(self.moves).get(name, 0.0) > 0 for name in FUSED_MOVES):
            raise InputError("--fused-generations needs a positive weight on nni or branch_multiplier")
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

    def program(self) -> "MC3Settings":
        """The settings the device program depends on: a run's length, tuning length and summaries do not
        (so a longer run, or a resumed one with more generations, compiles nothing new)."""
        return replace(self, generations=1, tune=0, stop_asdsf=None, burnin=0.0, min_split_frequency=0.0)


class UnrootedPosition(eqx.Module):
    """Every chain's tree and parameters, `[B]` leading (`B = runs x chains`, run-major)."""

    up: jax.Array  # [B, M] tip-0 view
    edge: jax.Array  # [B, M], or [B, M, K] (every part's: unlinked partitions)
    root: jax.Array  # [B] the kernel root's id
    params: dict  # unconstrained model parameters, [B, ...] each


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
    incremental: bool = eqx.field(static=True, default=True)  # keep every chain's partials (one `Model` only)

    @property
    def keeps_partials(self) -> bool:
        """Incremental likelihoods need one model and one set of lengths; partitioned models recompute all."""
        return self.incremental and not self.prior_only and isinstance(self.coordinates.template, Model)

    def _models(self, params):
        has_params = bool(jax.tree.leaves(params))
        return (jax.vmap(self.coordinates.model)(params) if has_params else self.coordinates.template), has_params

    def first_score(self, position: UnrootedPosition):
        """`(log L, log prior, partials)` of the chains' first positions (every node computed)."""
        if not self.keeps_partials:
            return (*self.log_posteriors(position), ())
        tree = jax.vmap(from_view)(position.up, position.edge, position.root)
        log_likelihood, partials = base.first_partials(*self._models(position.params), tree, self.data, self.dtype)
        return log_likelihood, self.log_priors(position.up, position.edge, position.params), partials

    def score(self, state: MCMCState, position: UnrootedPosition):
        """`(log L, log prior, partials)` of proposals, recomputing only the nodes above what each move changed
        against the chain's current tree (`state.position`, whose partials `state.cache` holds)."""
        if not self.keeps_partials:
            return (*self.log_posteriors(position), ())
        at = state.position
        log_likelihood, partials = base.proposed_log_likelihoods(
            state.cache, *self._models(position.params), jax.vmap(from_view)(position.up, position.edge, position.root),
            jax.vmap(from_view)(at.up, at.edge, at.root), position.params, at.params, self.data, self.dtype)
        return log_likelihood, self.log_priors(position.up, position.edge, position.params), partials

    def keep(self, partials, proposed, accept):
        return accept_partials(partials, proposed, accept) if self.keeps_partials else partials

    def log_posteriors(self, position: UnrootedPosition):
        """`(log L, log prior)` of every chain's position."""
        return (self.log_likelihoods(position.up, position.edge, position.root, position.params),
                self.log_priors(position.up, position.edge, position.params))

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


def _propose(posterior: Posterior, settings: MC3Settings, weights):
    """Every chain's proposal: with probability `weights[hmc] / sum(weights)` (one draw for all chains) an HMC
    move of every chain, else each chain's own move drawn from the other weights (`_local_proposals`)."""
    hmc = MOVES.index("hmc")
    hmc_enabled = dict(settings.moves).get("hmc", 0.0) > 0

    def propose(key, state: MCMCState, beta) -> Proposal:
        b = state.log_likelihood.shape[0]
        k_kind, k_move, k_hmc_pick, k_hmc = jax.random.split(key, 4)
        kind, use_hmc = draw_moves(k_kind, k_hmc_pick, weights, hmc, state.chain)
        at = state.position

        def hamiltonian(_):
            edge, params, log_q = hmc_proposal(chain_keys(k_hmc, state.chain), posterior, at.up, at.edge, at.root,
                                               at.params, beta, state.tunings[:, 3], settings.hmc_steps)
            return UnrootedPosition(at.up, edge, at.root, params), log_q, jnp.full(b, 3)

        local = lambda _: _local_proposals(state, posterior, settings, k_move, kind)  # noqa: E731
        position, log_q, slot = mixture(use_hmc, hmc_enabled, hamiltonian, local)
        return Proposal(position, log_q, jnp.where(use_hmc, hmc, kind), slot, ())

    return propose


def _local_proposals(state: MCMCState, posterior: Posterior, settings: MC3Settings, key, kind):
    """Each chain's own move: a tree move or one model parameter (`moves/_parameters.py`), chosen by `kind`.

    Returns `(position, log q, slot)`, `slot` the column of `tunings` the move used (-1 for a topology move).
    """
    at = state.position
    k_tree, k_param = jax.random.split(key)
    tree_kind = jnp.minimum(kind, len(TOPOLOGY_MOVES + BRANCH_MOVES) - 1)
    weights = dict(settings.moves)
    enabled = tuple(weights.get(name, 0.0) > 0 for name in TOPOLOGY_MOVES + BRANCH_MOVES)
    up, edge, log_q = jax.vmap(propose_tree, in_axes=(0, 0, 0, 0, None, 0, None))(
        tree_kind, chain_keys(k_tree, state.chain), at.up, at.edge, posterior.num_tips, state.tunings[:, :3], enabled)
    moving_params = kind == MOVES.index("parameters")
    slot = jnp.where(kind >= len(TOPOLOGY_MOVES), kind - len(TOPOLOGY_MOVES), -1)
    params = at.params
    if jax.tree.leaves(at.params):
        walked, log_q_params, site = jax.vmap(propose_parameters, in_axes=(0, 0, None, 0))(
            chain_keys(k_param, state.chain), at.params, posterior.supports(), state.tunings[:, 4:])
        params = where(moving_params, walked, at.params)
        log_q = jnp.where(moving_params, log_q_params, log_q)
        slot = jnp.where(moving_params, 4 + site, slot)
    up, edge = where(moving_params, (at.up, at.edge), (up.astype(at.up.dtype), edge))
    return UnrootedPosition(up, edge, at.root, params), log_q, slot


def _target_acceptance(slot):
    """HMC's (tuning column 3) target acceptance is 0.65; every other move's 0.3."""
    return jnp.where(slot == 3, HMC_TARGET_ACCEPTANCE, TARGET_ACCEPTANCE)


def move_weights(settings: MC3Settings, has_params: bool) -> jax.Array:
    """The weights of `MOVES`, with nothing to move for `parameters` when the model has no free parameter."""
    weights = jnp.asarray([dict(settings.moves).get(name, 0.0) for name in MOVES])
    return weights if has_params else weights.at[MOVES.index("parameters")].set(0.0)


def build_kernel(posterior: Posterior, settings: MC3Settings, tune_generations, has_params: bool):
    """`step(key, state) -> (state, info)`: one generation of every chain (`base.build_kernel` with MC³'s
    proposals), at its heat, then the heat swaps (`tempered.tempered`); with `settings.fused_generations`, then
    that many generations of NNI and branch multiplier (`fused_block`)."""
    step = base.build_kernel(_propose(posterior, settings, move_weights(settings, has_params)), posterior.score,
                             _target_acceptance, tune_generations, (1e-4, 20.0), posterior.keep)
    step = tempered.tempered(step, settings.chains, settings.temperature)
    if not settings.fused_generations:
        return step
    fused = fused_block(posterior, settings, has_params)

    def with_fused(key, state):
        k_step, k_fused = jax.random.split(key)
        state, info = step(k_step, state)
        return fused(k_fused, state), info

    return with_fused


def fused_block(posterior: Posterior, settings: MC3Settings, has_params: bool):
    """`block(key, state) -> state`: `settings.fused_generations` generations of every chain at its heat, each a
    stochastic NNI or a branch multiplier (drawn by their weights in `settings.moves`), tgMC³'s way where the
    kept partials allow: one launch of `kernels.fused_generations` (proposal, dirty path, acceptance and the
    next proposal inside the program, chains across the grid), its draws from each chain's own stream.
    Elsewhere (the C++ or XLA update, a partitioned model, data one program per chain covers slowly) the same
    moves one generation at a time through `base.build_kernel`. Either way the acceptances count as the moves',
    the multiplier uses the size the outer generations tune (the block itself tunes nothing), and `generation`
    (tuning's clock) counts the outer generations only."""
    count = settings.fused_generations
    weights = dict(settings.moves)
    nni = weights.get("nni", 0.0) / sum(weights.get(name, 0.0) for name in FUSED_MOVES)
    nni = nni if posterior.num_tips > 3 else 0.0  # three taxa have no internal edge
    beta = tempered.heats(settings.chains, settings.temperature)
    data = posterior.data
    fusable = posterior.keeps_partials and kernels.fuses_generations(
        data.tip_table.shape[1], data.tip_codes.shape[1], category_count(posterior.coordinates.template))
    if not fusable:
        only = replace(settings, moves={name: weights.get(name, 0.0) for name in FUSED_MOVES}, fused_generations=0)
        one = base.build_kernel(_propose(posterior, only, move_weights(only, has_params)), posterior.score,
                                _target_acceptance, 0, (1e-4, 20.0), posterior.keep)  # no tuning, as fused

        def stepwise(key, state: tempered.TemperedState):
            chains = jax.lax.fori_loop(
                0, count, lambda i, c: one(jax.random.fold_in(key, i), c, beta[state.heat])[0], state.chains)
            return eqx.tree_at(lambda s: s.chains, state, eqx.tree_at(lambda c: c.generation, chains,
                                                                       state.chains.generation))

        return stepwise

    def fused(key, state: tempered.TemperedState):
        chains = state.chains
        at = chains.position
        parents, lengths = jax.vmap(from_view)(at.up, at.edge, at.root)
        b, n = parents.shape[0], posterior.num_tips
        models, per_chain = posterior._models(at.params)
        node = jnp.arange(parents.shape[1])

        def draw(key, up, tuning):
            """One chain's `count` generations: kind, edge, NNI side, `log m`, `log u`. The 2N - 3 edges are the
            view's (`up >= 0`; the view edge of tip 0's neighbour w is kernel node 0's); the N - 3 internal ones
            lie above internal nodes whose view parent is internal. NNIs keep node ids, so both sets hold."""
            k_kind, k_edge, k_side, k_m, k_u = jax.random.split(key, 5)
            kinds = jax.random.bernoulli(k_kind, nni, (count,)).astype(jnp.int32)
            edge_keys = jax.random.split(k_edge, count)
            choose = lambda mask: jax.vmap(uniform_choice, (0, None))(edge_keys, mask)  # noqa: E731
            multiplied = choose(up >= 0)
            multiplied = jnp.where(multiplied == jnp.argmax(up == 0), 0, multiplied)
            edges = jnp.where(kinds == 1, choose((node >= n) & (up >= n)), multiplied)
            sides = jax.random.bernoulli(k_side, 0.5, (count,)).astype(jnp.int32)
            log_m = tuning * (jax.random.uniform(k_m, (count,), posterior.dtype) - 0.5)
            return kinds, edges, sides, log_m, jnp.log(jax.random.uniform(k_u, (count,), posterior.dtype))

        kinds, edges, sides, log_m, log_u = jax.vmap(draw)(chain_keys(key, chains.chain), at.up, chains.tunings[:, 0])
        cache = chains.cache
        parents, lengths, partials, log_scales, buffer, log_likelihood, accepted = kernels.fused_generations(
            *spectral_arrays(models, posterior.dtype, per_chain, b), data.tip_codes, data.tip_table, data.weights,
            parents, lengths, cache.partials, cache.log_scales, cache.current, chains.log_likelihood,
            beta[state.heat], kinds, edges, sides, log_m, log_u, posterior.branch_rate)
        up, edge = jax.vmap(to_view)(parents, lengths)
        columns = jnp.asarray([MOVES.index(name) for name in FUSED_MOVES])
        proposed = jnp.stack([count - jnp.sum(kinds, axis=1), jnp.sum(kinds, axis=1)], axis=1).astype(jnp.int32)
        chains = eqx.tree_at(
            lambda c: (c.position, c.log_likelihood, c.log_prior, c.proposed, c.accepted, c.cache), chains,
            (UnrootedPosition(up.astype(at.up.dtype), edge, at.root, at.params), log_likelihood,
             posterior.log_priors(up, edge, at.params), chains.proposed.at[:, columns].add(proposed),
             chains.accepted.at[:, columns].add(accepted), NodePartials(partials, log_scales, buffer, cache.computed)))
        return eqx.tree_at(lambda s: s.chains, state, chains)

    return fused


class Sample(eqx.Module):
    """The cold chain of every run at one sampled generation (`[runs, ...]`)."""

    parents: jax.Array
    lengths: jax.Array
    params: dict
    log_likelihood: jax.Array
    log_prior: jax.Array


def cold_chains(state: tempered.TemperedState, settings: MC3Settings) -> Sample:
    """The cold chain of every run."""
    pick = tempered.cold(state, settings.chains)
    chains = state.chains
    at = chains.position
    parents, lengths = jax.vmap(from_view)(pick(at.up), pick(at.edge), pick(at.root))
    return Sample(parents, lengths, jax.tree.map(pick, at.params), pick(chains.log_likelihood),
                  pick(chains.log_prior))


def _block(state: tempered.TemperedState, key, posterior: Posterior, settings: MC3Settings, count,
           tune_generations):
    with SHARE_TRACING:  # traced in threads by `next_block` (NumPyro's handlers are not per thread)
        step = build_kernel(posterior, settings, tune_generations, bool(jax.tree.leaves(state.chains.position.params)))
        return base.sample_blocks(step, state, key, count, settings.block, settings.sample_every,
                                  lambda s: cold_chains(s, settings))


@eqx.filter_jit
def run_block(state: tempered.TemperedState, key, posterior: Posterior, settings: MC3Settings, count,
              tune_generations, mesh=None):
    """`count` (<= `settings.block`) samples of `sample_every` generations each, `count` and
    `tune_generations` traced (one program per `settings.program()`); returns `(state, key, the cold chains at
    each sample [block, runs, ...])` (rows past `count` repeat the last state). With `mesh` (rows dividing
    the runs, patterns not split) each device runs its runs on its own under one `shard_map` program
    (`runtime.shard_batch`)."""
    if mesh is None:
        return _block(state, key, posterior, settings, count, tune_generations)
    arrays, static = eqx.partition(posterior, eqx.is_array)
    share = lambda state, key, arrays, count, tune: _block(  # noqa: E731
        state, key, eqx.combine(arrays, static), settings, count, tune)
    return shard_batch(share, mesh, (state,), (key, arrays, count, tune_generations), _block_specs(state))


def _block_specs(state):
    return batch_specs(state), PartitionSpec(), PartitionSpec(None, "batch")


def next_block(state: tempered.TemperedState, key, posterior: Posterior, settings: MC3Settings, count,
               tune_generations, mesh=None):
    """`run_block` as `mesh` allows: on a mesh whose rows divide the runs (patterns not split), each device
    runs its runs on its own: a thread per device on this process's devices (`runtime.run_shares`), one
    `shard_map` program on a mesh spanning processes. The chains are those of one device, as every draw is
    a chain's or a run's own."""
    if not splits_batch(mesh, settings.runs):
        return run_block(state, key, posterior, settings, count, tune_generations)
    if not is_local(mesh):
        return run_block(state, key, posterior, settings, count, tune_generations, mesh)
    arrays, static = eqx.partition(posterior, eqx.is_array)
    share = lambda state, key, arrays, count, tune: run_block(  # noqa: E731
        state, key, eqx.combine(arrays, static), settings, count, tune)
    return run_shares(share, mesh, (state,), (key, arrays, count, tune_generations), _block_specs(state))


def without_partials(state: tempered.TemperedState) -> tempered.TemperedState:
    """The state a checkpoint keeps: the partials are left out (hundreds of MB on large alignments) and
    `with_partials` computes them again, to the same bits (a node's partials depend on its subtree alone)."""
    return eqx.tree_at(lambda s: s.chains.cache, state, ())


@eqx.filter_jit
def with_partials(state: tempered.TemperedState, posterior: Posterior) -> tempered.TemperedState:
    return eqx.tree_at(lambda s: s.chains.cache, state, posterior.first_score(state.chains.position)[2])


@eqx.filter_jit  # one program: run eagerly, its few hundred operations were ~110 programs to trace and load
def init(trees, params, posterior: Posterior, settings: MC3Settings) -> tempered.TemperedState:
    """Chains started from kernel trees `(parents [B, M], lengths [B, M] or [B, M, K])` and parameters `[B, ...]`,
    run-major, heat `k` on chain `k` of every run."""
    parents, lengths = trees
    up, edge = jax.vmap(to_view)(jnp.asarray(parents, jnp.int32), jnp.asarray(lengths))
    root = jnp.argmin(jnp.asarray(parents), axis=1).astype(jnp.int32)
    b = parents.shape[0]
    sites = [START_TUNING[support_kind(support)] for _, support in sorted(posterior.supports().items())]
    tunings = jnp.broadcast_to(jnp.asarray([MULTIPLIER_TUNING] * 3 + [HMC_START_STEP] + sites), (b, 4 + len(sites)))
    chains = base.init(UnrootedPosition(up, edge, root, params), posterior.first_score, tunings, (), len(MOVES))
    return tempered.init(chains, settings.runs, settings.chains)
