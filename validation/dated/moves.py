"""Which moves move the tree: the dated sampler under one set of move weights, measured move by move (issue #39).

    python validation/dated/moves.py run --dataset dengue4_env --preset default --chains 4 --generations 4000 \
        --out /tmp/moves/default.json
    python validation/dated/moves.py summarise /tmp/moves/*.json

`run` samples run_jaxphylo.py's posterior (HKY+FO+G4 and its priors, strict clock, constant-size coalescent, tip
dates as exact years) with the move weights of `--preset` (`PRESETS`; BEAST's operator schedule is the
reference), changed by `--moves name=weight,...` (the sampler's move names, `DATED_MOVES`; 0 turns one off, but
HMC is the only move of the clock rate, population size and model parameters: `hmc=0` holds them at the start), for
`--generations` or until `--seconds` of sampling have passed, whichever comes first; `--heats H` runs every chain as
a run of H chains (Metropolis coupling; the cold chains are sampled). Its own driver runs the
kernel (`build_kernel`) from `dated_mcmc`'s start and key, so the chains are the ones `dated_mcmc` would run,
and watches every generation (`MoveEffects`); compilation is timed apart (a block of no samples first).
Everything below leaves out the tuning phase (the first `--tune` generations, when the moves' sizes and HMC's
mass still change); "per minute" is per minute of sampling (tuning included, compilation not). The JSON has:

* per move (the moves of chains that were cold when they moved, with `--heats`): proposals, acceptance, the share of
  accepted proposals that changed the unranked rooted topology (the tree's set of clades; a node-height, root-height
  or HMC move never does, an accepted narrow exchange always does), and the mean |change of the root height| per
  accepted proposal and per proposal;
* the root height's and the topology's series, whose ESS `summarise` computes (where ArviZ is: the GPU machine
  may lack it) with both per minute: the root height's is that of `age(root)`, its mirror image;
  the topology's is the ESS of each sample's rooted Robinson-Foulds distance (the number of clades in one tree
  but not the other) to the run's maximum-clade-credibility sample (TreeAnnotator's: the sample whose clades'
  frequencies have the greatest product), a number that moves only when the topology does;
* each ESS twice: `ess`, ArviZ's bulk ESS of all chains' draws together (`[chain, draw]`: chains that disagree
  lower it), and `ess_summed`, each chain's bulk ESS summed (run_jaxphylo.py's estimator); None for a series
  that never moved;
* the largest difference of a clade's frequency between the first and the second half of the chains.

`summarise` prints a Markdown table of several runs' JSONs.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from run_jaxphylo import DATA, read_dataset, summed_ess  # first: it turns float64 on

import jaxphylo as jp
from jaxphylo.inference import tempered
from jaxphylo.inference.base import changed_weights, sample_blocks
from jaxphylo.inference.dated import (
    DATED_MOVES, DatedSettings, build_kernel, clade_frequencies, clade_masks, dated_start,
)
from jaxphylo.tree import jump_rounds, jumps

DEFAULT = dict(DatedSettings().moves)  # BEAUti's weights, the topology moves' doubled, the uniform's 30 halved (HMC)
PRESETS = {
    "default": DEFAULT,
    # BEAUti 1.10's time-tree operators: subtree slide 15, narrow 15, wide 3, Wilson-Balding 3, uniform 30, root 3;
    # HMC's 3 stands for the scale operators on the parameters
    "beast": {**DEFAULT, "narrow_exchange": 15.0, "wide_exchange": 3.0, "subtree_slide": 15.0,
              "wilson_balding": 3.0, "node_height": 30.0},
    # the sampler's default before this measurement: BEAUti's with the uniform halved
    "previous-default": {**DEFAULT, "narrow_exchange": 15.0, "wide_exchange": 3.0, "subtree_slide": 15.0,
                         "wilson_balding": 3.0},
    "hmc-heavy": {**DEFAULT, "hmc": 9.0},
}
SHORT = {"narrow_exchange": "narrow", "wide_exchange": "wide", "subtree_slide": "slide", "wilson_balding": "WB",
         "node_height": "height", "root_height": "root", "hmc": "HMC"}


def move_weights(preset: str, changes: str | None) -> dict:
    """The preset's weights, with `name=weight,...` changed."""
    return dict(changed_weights(tuple(PRESETS[preset].items()), changes))


def tip_codes(n: int) -> Array:
    """A random 64-bit code for each of `n` tips (the same every run)."""
    return jnp.asarray(np.random.default_rng(0).integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True))


def ancestor_bits(parents: Int[Array, " M"]) -> Array:
    """`[M, words]` uint32: bit `u` of row `v` is set when `u` is `v` or an ancestor of it (pointer jumping: after
    round `r` a row holds the ancestors closer than `2^r`)."""
    m = parents.shape[0]
    node = jnp.arange(m)
    one = jnp.left_shift(jnp.uint32(1), (node % 32).astype(jnp.uint32))
    bits = jnp.zeros((m, (m + 31) // 32), jnp.uint32).at[node, node // 32].set(one)
    jump = jumps(parents)
    for _ in range(jump_rounds(m)):
        bits, jump = bits | bits[jump], jump[jump]
    return bits


def clade_codes(parents: Int[Array, "B M"], codes) -> Array:
    """Every chain's clades as sorted 64-bit codes `[B, M]`: a node's code is the sum (mod 2^64) of the random
    codes of the tips below it, so two trees' sorted codes are equal when their sets of clades are, and, but for a
    collision (a chance of about M^2 / 2^64), only then."""
    n, node = codes.shape[0], jnp.arange(parents.shape[-1])

    def one(parents):
        below = (ancestor_bits(parents)[:n, node // 32] >> (node % 32).astype(jnp.uint32)) & 1  # [tips, M]
        return jnp.sort(jnp.sum(jnp.where(below == 1, codes[:, None], jnp.zeros((), codes.dtype)), axis=0))

    return jax.vmap(one)(parents)


class MoveEffects(eqx.Module):
    """What every chain's moves did once tuning was over, by move (`[B, moves]`, moves as `DATED_MOVES`), and the
    current trees' `clade_codes`."""

    proposed: Int[Array, "B moves"]
    accepted: Int[Array, "B moves"]
    reshaped: Int[Array, "B moves"]  # accepted proposals that changed the topology
    root_shift: Float[Array, "B moves"]  # the summed |change of the root height| of accepted proposals
    clades: Array  # [B, M] the current trees' clade codes

    @classmethod
    def start(cls, position, codes) -> "MoveEffects":
        counts = jnp.zeros((position.parents.shape[0], len(DATED_MOVES)), jnp.int32)
        return cls(counts, counts, counts, counts.astype(position.heights.dtype),
                   clade_codes(position.parents, codes))

    def add(self, old, new, info, counted, codes) -> "MoveEffects":
        """One generation from position `old` to `new` (`info`: the kernel's move and accept decision), counted
        only for the chains where `counted` (`[B]`) holds. A move changed the topology (the unranked rooted tree,
        its set of clades) when the clade codes changed; the new trees are coded only in generations where some
        chain's parents changed (never in HMC's, nor in a height move's)."""
        clades = jax.lax.cond(jnp.any(old.parents != new.parents), lambda _: clade_codes(new.parents, codes),
                              lambda _: self.clades, None)
        reshaped = jnp.any(clades != self.clades, axis=-1)
        chosen = jax.nn.one_hot(info.move, len(DATED_MOVES), dtype=jnp.int32) * counted[:, None]
        shift = jnp.abs(jnp.max(new.heights, -1) - jnp.max(old.heights, -1))
        return MoveEffects(self.proposed + chosen, self.accepted + chosen * info.accepted[:, None],
                           self.reshaped + chosen * reshaped[:, None], self.root_shift + chosen * shift[:, None],
                           clades)


@eqx.filter_jit
def measured_block(carry, key, posterior, settings: DatedSettings, codes, count, tune):
    """`count` (<= `settings.block`, traced) samples of `sample_every` generations of the dated kernel from `carry`
    = `(state, MoveEffects)`, each generation's effects added once `generation >= tune`, for the chains that
    were cold when they moved: `(carry, key, samples)`, the samples every run's cold chain's `(parents, heights)`
    `[block, runs, M]`; `run_block`'s keys and so its chains."""
    step = build_kernel(posterior, settings, tune)

    def measured(key, carry):
        state, effects = carry
        new, info = step(key, state)
        counted = (state.chains.generation >= tune) & (state.heat == 0)
        return (new, effects.add(state.chains.position, new.chains.position, info, counted, codes)), info

    def observe(carry):
        pick = tempered.cold(carry[0], settings.heats)
        return pick(carry[0].chains.position.parents), pick(carry[0].chains.position.heights)

    return sample_blocks(measured, carry, key, count, settings.block, settings.sample_every, observe)


def sample(posterior, state, settings: DatedSettings, seed: int, tune: int, seconds: float) -> dict:
    """Blocks of samples until `settings.generations` or `seconds` of sampling: the effects, every sample's
    `parents` and `heights` (`[samples, B, M]`) and generation, the generations run and the seconds compiling
    and sampling took."""
    codes = tip_codes((state.chains.position.parents.shape[1] + 1) // 2)
    carry = (state, MoveEffects.start(state.chains.position, codes))
    key, program, tune = jax.random.PRNGKey(seed), settings.program(), np.int32(tune)
    began = time.perf_counter()
    jax.block_until_ready(measured_block(carry, key, posterior, program, codes, np.int32(0), tune))  # compiles
    compiled = time.perf_counter() - began
    total, parents, heights = settings.generations // settings.sample_every, [], []
    began = time.perf_counter()
    while len(parents) < total and time.perf_counter() - began < seconds:
        count = min(settings.block, total - len(parents))
        carry, key, block = measured_block(carry, key, posterior, program, codes, np.int32(count), tune)
        parents += list(np.asarray(block[0][:count]))
        heights += list(np.asarray(block[1][:count]))
    sampling = time.perf_counter() - began
    effects = jax.tree.map(np.asarray, carry[1])
    return {"effects": effects, "parents": np.asarray(parents), "heights": np.asarray(heights),
            "generation": settings.sample_every * np.arange(1, len(parents) + 1),
            "generations": int(carry[0].chains.generation), "compile_seconds": compiled, "sampling_seconds": sampling,
            "swap_rates": np.asarray(carry[0].swaps_accepted) / np.maximum(np.asarray(carry[0].swaps_tried), 1)}


def per_move(effects: MoveEffects, weights: dict) -> dict:
    """Every proposed move's counts (summed over chains), acceptance, share of its acceptances that changed the
    topology and mean |root height change| per acceptance and per proposal."""
    proposed, accepted, reshaped, shift = (np.asarray(x).sum(0) for x in (effects.proposed, effects.accepted,
                                                                           effects.reshaped, effects.root_shift))
    out = {}
    for k, name in enumerate(DATED_MOVES):
        if proposed[k] == 0:
            continue
        share = lambda x: float(x / accepted[k]) if accepted[k] else None  # noqa: E731
        out[name] = {"weight": weights.get(name, 0.0), "proposals": int(proposed[k]), "accepted": int(accepted[k]),
                     "topology_changes": int(reshaped[k]), "acceptance": float(accepted[k] / proposed[k]),
                     "topology_changed_share": share(reshaped[k]), "root_shift_per_accept": share(shift[k]),
                     "root_shift_per_proposal": float(shift[k] / proposed[k])}
    return out


def ess(values, minutes: float) -> dict:
    """ArviZ's bulk ESS of `values` `[chains, draws]`, of all chains together and summed chain by chain, and
    both per minute: None for a series that never moved, and a chain that never moved adds nothing to the sum
    (ArviZ would count each of its draws as independent)."""
    import arviz  # here: `run` on a machine without ArviZ keeps the series, and `summarise` computes this

    values = np.asarray(values, float)
    if np.ptp(values) == 0:
        return {"ess": None, "ess_summed": None, "ess_per_minute": None, "ess_summed_per_minute": None}
    together, summed = float(arviz.ess(values, method="bulk")), summed_ess(values[np.ptp(values, axis=1) > 0])
    finite = lambda x: x if math.isfinite(x) else None  # noqa: E731
    return {"ess": finite(together), "ess_summed": finite(summed), "ess_per_minute": finite(together / minutes),
            "ess_summed_per_minute": finite(summed / minutes)}


def chain_clades(parents, heights) -> list[list[list[int]]]:
    """Every sample's node clades (`clade_masks`), chain by chain: `[chain][sample][node]`."""
    return [[clade_masks(p, h) for p, h in zip(parents[:, c], heights[:, c])] for c in range(parents.shape[1])]


def mcc_clades(masks: list[list[int]]) -> set:
    """The internal clades of the maximum-clade-credibility sample among `masks` (each a sample's node clades)."""
    n = (len(masks[0]) + 1) // 2
    frequency = clade_frequencies(None, masks)
    scores = [sum(math.log(frequency[c]) for c in sample[n:]) for sample in masks]
    return set(masks[int(np.argmax(scores))][n:])


def halves_difference(clades: list) -> float | None:
    """The largest difference of a clade's frequency between the first half of the chains and the second."""
    half = len(clades) // 2
    if half == 0:
        return None
    first, second = (clade_frequencies(None, [s for chain in part for s in chain])
                     for part in (clades[:half], clades[half:]))
    return max(abs(first.get(c, 0.0) - second.get(c, 0.0)) for c in set(first) | set(second))


def topology(parents, heights) -> dict:
    """The series whose ESS is the topology's (every sample's rooted RF distance to the MCC sample) and the
    chain halves' largest clade-frequency difference."""
    clades = chain_clades(parents, heights)
    n = (parents.shape[-1] + 1) // 2
    reference = mcc_clades([s for chain in clades for s in chain])
    distance = [[len(set(s[n:]) ^ reference) for s in chain] for chain in clades]
    return {"reference": "maximum-clade-credibility sample", "mean_rf": float(np.mean(distance)),
            "series": distance, "max_clade_difference_halves": halves_difference(clades)}


def environment() -> dict:
    """The device, versions and commit a run used."""
    device = jax.devices()[0]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"device": str(device), "device_kind": device.device_kind, "platform": platform.platform(),
            "versions": {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__,
                         "jaxphylo": getattr(jp, "__version__", None)},
            "commit": commit}


def run(args) -> None:
    """One weight set on one data set: the JSON of the module docstring."""
    weights = move_weights(args.preset, args.moves)
    label = args.preset + (f" ({args.moves})" if args.moves else "") + (
        f", {args.heats} heats at {args.temperature:g}" if args.heats > 1 else "")
    began = time.perf_counter()
    alignment, dates = read_dataset(args.data / args.dataset)
    tune = args.generations // 10 if args.tune is None else args.tune
    settings = DatedSettings(chains=args.chains, heats=args.heats, temperature=args.temperature,
                             generations=args.generations, sample_every=args.sample_every, tune=tune, block=args.block,
                             moves=weights)
    posterior, state, reference = dated_start(alignment, args.model, dates, clock="strict",
                                              tree_prior="coalescent", settings=settings, seed=args.seed)
    started = time.perf_counter() - began
    done = sample(posterior, state, settings, args.seed, tune, math.inf if args.seconds is None else args.seconds)
    kept = done["generation"] > tune
    if kept.sum() < 4:
        raise SystemExit(f"{done['generations']} generations, {kept.sum()} samples after the {tune} of tuning: "
                         f"give more --seconds or --generations, or less --tune")
    parents, heights = done["parents"][kept], done["heights"][kept]
    roots = heights.max(-1).T  # [chains, draws]
    record = {"weight_set": label, "preset": args.preset, "moves": weights, **environment(),
              "settings": {"dataset": args.dataset, "taxa": len(alignment.taxa), "model": args.model,
                           "clock": "strict", "tree_prior": "constant coalescent", "chains": args.chains,
                           "heats": args.heats, "temperature": args.temperature,
                           "generations_max": args.generations, "seconds_max": args.seconds, "tune": tune,
                           "sample_every": args.sample_every, "block": args.block, "hmc_steps": settings.hmc_steps,
                           "seed": args.seed, "precision": "float64"},
              "start_seconds": started, "compile_seconds": done["compile_seconds"],
              "sampling_seconds": done["sampling_seconds"], "generations": done["generations"],
              "generations_per_second": done["generations"] / done["sampling_seconds"],
              "samples_per_chain": int(kept.sum()), "per_move": per_move(done["effects"], weights),
              "swap_rates": done["swap_rates"].mean(0).tolist(),
              "root_height": {"age_mean": float(reference - roots.mean()), "age_sd": float(roots.std()),
                              "series": roots.tolist()},
              "topology": topology(parents, heights)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record) + "\n")
    print(f"wrote {args.out}: {done['generations']} generations in {done['sampling_seconds']:.1f} s")


def with_ess(record: dict) -> dict:
    """The record with the ESS of its root-height and topology series (`ess`), computed where ArviZ is."""
    minutes = record["sampling_seconds"] / 60
    for key in ("root_height", "topology"):
        record[key] = {**record[key], **ess(record[key]["series"], minutes)}
    record["versions"]["arviz"] = __import__("arviz").__version__
    return record


def cell(x, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(records: list[dict]) -> str:
    """Markdown: per weight set the weights, generations per second, per move `acceptance / topology-changed
    share of the accepted`, the root height's and the topology's ESS per minute (all chains together, and summed
    chain by chain in brackets) and the chain halves' largest clade-frequency difference."""
    head = ["weight set", "weights " + "/".join(SHORT[m] for m in DATED_MOVES), "chains", "gens/s"]
    head += [f"{SHORT[m]} acc / topo" for m in DATED_MOVES]
    head += ["root ESS/min", "topology ESS/min", "max Δ clade (halves)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        moves = [r["per_move"].get(m) for m in DATED_MOVES]
        row = [r["weight_set"], "/".join(f"{r['moves'].get(m, 0):g}" for m in DATED_MOVES),
               str(r["settings"]["chains"]) + (f" × {r['settings']['heats']}" if r["settings"].get("heats", 1) > 1
                                               else ""), f"{r['generations_per_second']:.1f}"]
        row += ["–" if m is None else f"{m['acceptance']:.3f} / {cell(m['topology_changed_share'], 2)}" for m in moves]
        row += [f"{cell(r[k]['ess_per_minute'], 1)} ({cell(r[k]['ess_summed_per_minute'], 1)})"
                for k in ("root_height", "topology")]
        row.append(cell(r["topology"]["max_clade_difference_halves"], 3))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one weight set: a JSON")
    one.add_argument("--dataset", required=True)
    one.add_argument("--data", type=Path, default=DATA)
    one.add_argument("--model", default="HKY+FO+G4", help="run_jaxphylo.py's (HKY+FO+G4m: BEAST's median Gamma)")
    one.add_argument("--preset", choices=sorted(PRESETS), default="default")
    one.add_argument("--moves", help="weights changed from the preset's, e.g. node_height=30,hmc=6")
    one.add_argument("--chains", type=int, default=4, help="runs, each sampled from its cold chain")
    one.add_argument("--heats", type=int, default=1, help="chains per run, heated by 1 / (1 + T k) (1: none)")
    one.add_argument("--temperature", type=float, default=0.1, help="T")
    one.add_argument("--generations", type=int, default=10_000, help="at most this many")
    one.add_argument("--seconds", type=float, default=None, help="stop after this much sampling (default: none)")
    one.add_argument("--tune", type=int, default=None, help="generations of tuning (default a tenth)")
    one.add_argument("--sample-every", type=int, default=10)
    one.add_argument("--block", type=int, default=10, help="samples per device call (the budget is checked between)")
    one.add_argument("--seed", type=int, default=1)
    one.add_argument("--out", type=Path, required=True)
    many = commands.add_parser("summarise", help="a Markdown table of runs' JSONs")
    many.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        print(table([with_ess(json.loads(path.read_text())) for path in args.runs]))


if __name__ == "__main__":
    main()
