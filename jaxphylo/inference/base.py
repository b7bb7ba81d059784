"""What every Metropolis–Hastings sampler here shares: a batch of chains, a weighted mixture of moves, one
accept rule and one tuning rule.

A generation of a batch of `B` chains draws each chain's move from the weights of the local moves (a
categorical draw per chain), or, with probability `w_hmc / sum(w)` (one draw for all chains, so that the
gradient program runs for all or none), an HMC move of every chain (`mixture`). The proposal with
log proposal ratio `log q` is accepted with probability `min(1, exp(beta dlog posterior + log q))`
(`metropolis_hastings`); a chain whose proposed posterior is not finite keeps its state. While tuning,
the tuning of the move used (a multiplier's lambda, a window, an HMC step size) takes a Robbins–Monro step
on its log towards the move's target acceptance: `log s += (accepted - target) / sqrt(1 + g / 100)`
(`robbins_monro`).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._errors import InputError
from ..likelihood import full_partials, proposed_partials


def check_moves(moves: tuple, known: tuple) -> None:
    """`(name, weight)` pairs: known names, weights non-negative and not all zero."""
    if unknown := sorted(set(dict(moves)) - set(known)):
        raise InputError(f"unknown move {unknown[0]!r}: moves are {', '.join(known)}")
    if any(w < 0 for _, w in moves) or sum(w for _, w in moves) <= 0:
        raise InputError("move weights must be non-negative and not all zero")


def changed_weights(moves: tuple, changes: str | None) -> tuple:
    """`(name, weight)` pairs with `NAME=W,...` changed or added (the names are checked by `check_moves`)."""
    weights = dict(moves)
    for item in filter(None, (part.strip() for part in (changes or "").split(","))):
        name, equals, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            equals = ""
        if not equals:
            raise InputError(f"move weights: expected NAME=WEIGHT, got {item!r}")
    return tuple(weights.items())


def where(mask: Bool[Array, " B"], new, old):
    """`new` where the per-chain `mask` holds, else `old` (pytrees whose leaves are `[B, ...]`)."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old)


def uniform_choice(key, mask: Bool[Array, " n"]) -> Int[Array, ""]:
    """A uniformly random index where `mask` holds (argmax of masked uniforms)."""
    return jnp.argmax(jnp.where(mask, jax.random.uniform(key, mask.shape), -1.0)).astype(jnp.int32)


def chain_keys(key, chain: Int[Array, " B"]):
    """Each chain's own key, `fold_in(key, chain[b])` (`[B]` keys).

    Every per-chain draw comes from the chain's own stream, numbered by its index in the whole batch
    (`MCMCState.chain`): a chain draws the same numbers whichever chains share its device, so a run split over
    devices, each running its share on its own (`runtime.run_shares`, `runtime.shard_batch`), equals the run on one."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, chain)


def draw_moves(key_kind, key_pick, weights: Float[Array, " moves"], hmc: int, chain: Int[Array, " B"]):
    """Each chain's local move (`[B]` indices into `weights[:hmc]`), and whether this generation is HMC's (one
    draw from the shared key, the same on every device)."""
    logits = jnp.log(weights[:hmc])
    kind = jax.vmap(lambda k: jax.random.categorical(k, logits))(chain_keys(key_kind, chain))
    use_hmc = jax.random.uniform(key_pick) * jnp.sum(weights) < weights[hmc]
    return kind, use_hmc


def mixture(use_hmc, hmc_enabled: bool, hamiltonian, local):
    """`hamiltonian(None)` or `local(None)` as `use_hmc` says; with HMC's weight zero (static) the gradient
    program is not even built."""
    if hmc_enabled:
        return jax.lax.cond(use_hmc, hamiltonian, local, None)
    return local(None)


def metropolis_hastings(key, chain: Int[Array, " B"], log_ratio: Float[Array, " B"],
                        log_posterior: Float[Array, " B"]) -> Bool[Array, " B"]:
    """Each chain's accept decision: `log u < log_ratio` (`u` from the chain's own stream), and never a
    non-finite proposed posterior."""
    u = jax.vmap(jax.random.uniform)(chain_keys(key, chain))
    return (jnp.log(u) < log_ratio) & jnp.isfinite(log_posterior)


def tally(proposed, accepted, kind: Int[Array, " B"], accept: Bool[Array, " B"]):
    """Per-chain counts of proposals and acceptances by move (`[B, moves]` each)."""
    chosen = jax.nn.one_hot(kind, proposed.shape[1], dtype=proposed.dtype)
    return proposed + chosen, accepted + chosen * accept[:, None]


def robbins_monro(tunings: Float[Array, "B T"], column: Int[Array, " B"], accept: Bool[Array, " B"], target,
                  generation, tune_generations: int, bounds: tuple[float, float]) -> Float[Array, "B T"]:
    """One Robbins–Monro step on the log of each chain's tuning `column` (-1: none) towards `target` while
    `generation < tune_generations`; tunings stay within `bounds`."""
    tunable = (column >= 0) & (generation < tune_generations)
    step = (accept.astype(tunings.dtype) - target) / jnp.sqrt(1.0 + generation / 100.0)
    change = jax.nn.one_hot(jnp.maximum(column, 0), tunings.shape[1]) * jnp.where(tunable, step, 0.0)[:, None]
    return jnp.clip(tunings * jnp.exp(change), *bounds)


class MCMCState(eqx.Module):
    """A batch of `B` chains of a Metropolis–Hastings sampler (every leaf `[B, ...]` but `generation`).

    `position` is the sampler's own point (a tree and its parameters); `adaptation` is what every generation
    updates whatever the accept decision (HMC's running mass matrix), `()` when the sampler has none; `cache`
    is what the likelihood keeps between generations (every chain's partials, so that a move pays only for
    the nodes it touched), `()` when it keeps nothing."""

    position: object
    log_likelihood: Float[Array, " B"]
    log_prior: Float[Array, " B"]
    tunings: Float[Array, "B T"]  # every tunable move's size (a multiplier's lambda, a window, HMC's step)
    adaptation: object
    proposed: Int[Array, "B moves"]  # counts, for acceptance rates
    accepted: Int[Array, "B moves"]
    chain: Int[Array, " B"]  # each chain's index in the whole batch: its random stream (`chain_keys`)
    generation: Int[Array, ""]  # generations done
    cache: object = ()


class MCMCInfo(eqx.Module):
    """What one generation did, per chain."""

    move: Int[Array, " B"]  # the move used (an index into the sampler's move names)
    accepted: Bool[Array, " B"]
    log_ratio: Float[Array, " B"]  # beta (dlog L + dlog prior) + log q


class Proposal(eqx.Module):
    """A proposal for every chain: the new position, `log q` (the log Hastings ratio with its Jacobian), the move
    drawn, the column of `tunings` it used (-1: none) and the adaptation after it."""

    position: object
    log_q: Float[Array, " B"]
    move: Int[Array, " B"]
    slot: Int[Array, " B"]
    adaptation: object


def init(position, first_score, tunings: Float[Array, "B T"], adaptation, moves: int) -> MCMCState:
    """Chains at `position`, scored by `first_score(position) -> (log L [B], log prior [B], cache)`."""
    log_likelihood, log_prior, cache = first_score(position)
    b = tunings.shape[0]
    zeros = jnp.zeros((b, moves), jnp.int32)
    return MCMCState(position, log_likelihood, log_prior, tunings, adaptation, zeros, zeros,
                     jnp.arange(b, dtype=jnp.int32), jnp.zeros((), jnp.int32), cache)


def keep_nothing(cache, proposed, accept):
    return cache


def build_kernel(propose, score, target_acceptance, tune_generations, bounds: tuple[float, float],
                 keep=keep_nothing):
    """The Metropolis–Hastings kernel `step(key, state, beta=1) -> (state, info)` every sampler here runs.

    `propose(key, state, beta) -> Proposal` draws each chain's move (a mixture: `draw_moves`, `mixture`);
    `score(state, position) -> (log L, log prior, cache)` scores every proposal in one batched call, from the
    likelihood's `state.cache` where it keeps one, and `keep(state.cache, cache, accept)` is the cache of the
    kept states (`keep_nothing` where there is none);
    `target_acceptance(slot) -> [B]` is each move's Robbins–Monro target, taken while
    `generation < tune_generations` (a traced number, so that the run's length does not change the program).
    Chains run at inverse temperatures `beta` (`[B]`, heating prior and likelihood together, as MrBayes does):
    the accept probability is `min(1, exp(beta (dlog L + dlog prior) + log q))`.
    """

    def step(key, state: MCMCState, beta=1.0):
        k_move, k_accept = jax.random.split(key)
        proposal = propose(k_move, state, beta)
        log_likelihood, log_prior, cache = score(state, proposal.position)
        log_ratio = beta * (log_likelihood - state.log_likelihood + log_prior - state.log_prior) + proposal.log_q
        accept = metropolis_hastings(k_accept, state.chain, log_ratio, log_likelihood + log_prior)
        position, log_likelihood, log_prior = where(accept, (proposal.position, log_likelihood, log_prior),
                                                    (state.position, state.log_likelihood, state.log_prior))
        proposed, accepted = tally(state.proposed, state.accepted, proposal.move, accept)
        tunings = robbins_monro(state.tunings, proposal.slot, accept, target_acceptance(proposal.slot),
                                state.generation, tune_generations, bounds)
        state = MCMCState(position, log_likelihood, log_prior, tunings, proposal.adaptation, proposed, accepted,
                          state.chain, state.generation + 1, keep(state.cache, cache, accept))
        return state, MCMCInfo(proposal.move, accept, log_ratio)

    return step


def sample_blocks(step, state, key, count, block: int, sample_every, observe):
    """The block a run's driver asks for: `count` (<= `block`, traced) samples, each after `sample_every`
    generations of `step(key, state) -> (state, info)`, observed by `observe(state)`; rows past `count` repeat
    the last state. Returns `(state, key, samples [block, ...])`: one program for every block of a run."""

    def generation(_, carry):
        state, key = carry
        key, subkey = jax.random.split(key)
        return step(subkey, state)[0], key

    def sampled(carry, i):
        carry = jax.lax.fori_loop(0, jnp.where(i < count, sample_every, 0), generation, carry)
        return carry, observe(carry[0])

    (state, key), samples = jax.lax.scan(sampled, (state, key), jnp.arange(block))
    return state, key, samples


def first_partials(models, per_chain_models: bool, tree, data, dtype):
    """`(log L [B], partials)` of every chain's kernel tree `(parents [B, M], lengths [B, M])`, every node
    computed: the start of a sampler that keeps its partials (`likelihood.full_partials`)."""
    partials, per = full_partials(models, *tree, data, dtype, per_chain_models)
    return jnp.sum(data.weights * per, axis=-1), partials


def proposed_log_likelihoods(partials, models, per_chain_models: bool, tree, current_tree, params, current_params,
                             data, dtype):
    """`(log L [B], partials)` of proposed kernel trees from the current ones' `partials`: only the nodes above
    an edge whose parent or length changed are recomputed, and every node of a chain whose model parameters
    (`params`, a pytree of `[B, ...]`) moved (`likelihood.proposed_partials`)."""
    moved = [jnp.any((new != old).reshape(new.shape[0], -1), axis=1)
             for new, old in zip(jax.tree.leaves(params), jax.tree.leaves(current_params))]
    every_node = jnp.any(jnp.stack(moved), axis=0) if moved else None
    partials, per = proposed_partials(partials, models, *tree, *current_tree, data, dtype, per_chain_models,
                                      every_node)
    return jnp.sum(data.weights * per, axis=-1), partials
