"""Incremental against full likelihood recomputation in an MC³-like loop: time per generation of B chains.

A generation: every chain draws one of MC³'s tree moves (NNI, SPR, extending SPR/TBR, branch and tree-length
multipliers, node slider; `jaxphylo.inference.moves` on the tip-0 view), its log-likelihood is computed, and
it is accepted with probability 1/2 (the likelihood's cost does not depend on the rule). `generations` of
them run inside one jitted `fori_loop` (the partials a loop carry, updated in place), timed as a block:

- `full`: `batch_pattern_log_likelihoods` of every proposed tree (every node);
- `incremental`: `proposed_partials` (the dirty nodes only) and `accept_partials`;
- `moves`: the proposals alone, no likelihood (the floor both pay).

Also reported: nodes computed per chain and generation against the N - 1 of a full pass, the relative
difference of the two loops' summed log-likelihoods (same proposals, same accept draws), and the copies of
the partials buffer in the compiled incremental block (0: the buffers are updated in place).

    python benchmarks/incremental.py                  # DS1 (JC69) and carnivores (HKY+G4), B = 8
    python benchmarks/incremental.py --taxa 128 256   # plus simulated sets of these sizes (HKY+G4, 1,000 sites)

On a GPU the same command runs one Pallas launch per generation walking every chain's list, or with
`JAXPHYLO_KERNEL=xla` the XLA loop (one iteration per position of the longest dirty list); the file is
`incremental-<kernel>-<platform>.json`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, device_record, save  # noqa: E402

import jaxphylo as jp  # noqa: E402
from jaxphylo.inference.moves import propose_tree  # noqa: E402
from jaxphylo.likelihood import (  # noqa: E402
    accept_partials,
    batch_pattern_log_likelihoods,
    full_partials,
    kernels,
    max_step_width,
    pattern_data,
    proposed_partials,
)
from jaxphylo.tree import from_view, kernel_batch, phase_widths, to_view  # noqa: E402

TREE_MOVES = 7


def propose(parents, lengths, key, num_tips):
    k_kind, k_move = jax.random.split(key)
    up, edge = jax.vmap(to_view)(parents, lengths)
    kind = jax.random.randint(k_kind, (parents.shape[0],), 0, TREE_MOVES)
    up, edge, _ = jax.vmap(propose_tree, in_axes=(0, 0, 0, 0, None, None))(
        kind, jax.random.split(k_move, parents.shape[0]), up, edge, num_tips, jnp.full(3, 0.5))
    return jax.vmap(from_view)(up.astype(parents.dtype), edge, jnp.argmin(parents, axis=1).astype(parents.dtype))


def blocks(model, data, dtype, num_tips, chains, generations):
    widths = phase_widths(num_tips, max_step_width(model, data, dtype, chains))

    def loop(body, carry, key):
        return jax.lax.fori_loop(0, generations, lambda i, c: body(jax.random.fold_in(key, i), c), carry)

    def keep(key, parents, lengths, new_parents, new_lengths):
        accept = jax.random.bernoulli(key, 0.5, (chains,))
        pick = lambda new, old: jnp.where(accept[:, None], new, old)  # noqa: E731
        return accept, pick(new_parents, parents), pick(new_lengths, lengths)

    def full_step(key, carry):
        parents, lengths, total = carry
        k_move, k_accept = jax.random.split(key)
        new_parents, new_lengths = propose(parents, lengths, k_move, num_tips)
        per = batch_pattern_log_likelihoods(model, new_parents, new_lengths, data, widths, dtype)
        _, parents, lengths = keep(k_accept, parents, lengths, new_parents, new_lengths)
        return parents, lengths, total + jnp.sum(per)

    def incremental_step(key, carry):
        state, parents, lengths, total, computed = carry
        k_move, k_accept = jax.random.split(key)
        new_parents, new_lengths = propose(parents, lengths, k_move, num_tips)
        proposal, per = proposed_partials(state, model, new_parents, new_lengths, parents, lengths, data, dtype)
        accept, parents, lengths = keep(k_accept, parents, lengths, new_parents, new_lengths)
        state = accept_partials(state, proposal, accept)
        computed = computed + jnp.sum(proposal.computed).astype(computed.dtype)
        return state, parents, lengths, total + jnp.sum(per), computed

    def moves_step(key, carry):
        parents, lengths, total = carry
        k_move, k_accept = jax.random.split(key)
        new_parents, new_lengths = propose(parents, lengths, k_move, num_tips)
        _, parents, lengths = keep(k_accept, parents, lengths, new_parents, new_lengths)
        return parents, lengths, total + jnp.sum(new_lengths)

    return {
        "full": jax.jit(lambda carry, key: loop(full_step, carry, key), donate_argnums=0),
        "incremental": jax.jit(lambda carry, key: loop(incremental_step, carry, key), donate_argnums=0),
        "moves": jax.jit(lambda carry, key: loop(moves_step, carry, key), donate_argnums=0),
    }


def buffer_copies(compiled_text: str, shape: tuple[int, ...]) -> int:
    """Copies of an array of the partials buffer's shape in compiled HLO."""
    dims = ",".join(str(d) for d in shape)
    return len(re.findall(rf"\[{dims}\]\S* copy\(", compiled_text))


def run_case(name, alignment, model, model_name, chains, generations, repeats):
    trees = [jp.random_topology_tree(alignment.taxa, seed=s) for s in range(chains)]
    batch = kernel_batch(trees)
    data, dtype = pattern_data(alignment, batch), jnp.float64
    num_tips = len(alignment.taxa)
    functions = blocks(model, data, dtype, num_tips, chains, generations)
    def fresh(kind):  # every block's carry is donated: new arrays each time
        zero = jnp.zeros((), dtype)
        parents, lengths = jnp.array(batch.parents), jnp.array(batch.branch_lengths)
        if kind != "incremental":
            return parents, lengths, zero
        state, _ = full_partials(model, parents, lengths, data, dtype)
        return state, parents, lengths, zero, jnp.zeros((), jnp.int32)

    row = {"data": name, "model": model_name, "taxa": num_tips, "patterns": int(data.tip_codes.shape[1]),
           "chains": chains, "generations_per_block": generations}
    compiled, carries, times = {}, {}, {kind: [] for kind in functions}
    for kind, function in functions.items():
        carry = fresh(kind)
        start = time.perf_counter()
        compiled[kind] = function.lower(carry, jax.random.PRNGKey(0)).compile()
        row[f"{kind}_compile_s"] = round(time.perf_counter() - start, 2)
        if kind == "incremental":
            row["partials_buffer_copies_in_compiled_block"] = buffer_copies(compiled[kind].as_text(),
                                                                            carry[0].partials.shape)
        carries[kind] = jax.block_until_ready(compiled[kind](carry, jax.random.PRNGKey(0)))  # warm
    # Round robin, so that the load of a shared machine falls on every kind alike.
    for r in range(repeats):
        for kind in functions:
            start = time.perf_counter()
            carries[kind] = jax.block_until_ready(compiled[kind](carries[kind], jax.random.PRNGKey(r + 1)))
            times[kind].append(time.perf_counter() - start)
    for kind in functions:
        row[f"{kind}_ms_per_generation"] = round(statistics.median(times[kind]) / generations * 1e3, 4)
    row["nodes_computed_per_chain_generation"] = round(
        float(carries["incremental"][-1]) / ((repeats + 1) * generations * chains), 2)
    row["nodes_per_full_pass"] = num_tips - 1
    # The same proposals and accept draws in both loops: their summed log-likelihoods agree to rounding.
    full, incremental = float(carries["full"][-1]), float(carries["incremental"][-2])
    row["total_log_likelihood_relative_difference"] = abs(incremental - full) / abs(full)
    row["full_over_incremental"] = round(row["full_ms_per_generation"] / row["incremental_ms_per_generation"], 2)
    row["likelihood_only_full_over_incremental"] = round(
        (row["full_ms_per_generation"] - row["moves_ms_per_generation"])
        / max(row["incremental_ms_per_generation"] - row["moves_ms_per_generation"], 1e-9), 2)
    print(row, flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--generations", type=int, default=200, help="generations per timed block")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--taxa", type=int, nargs="*", default=[], help="also simulated sets of these sizes")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    record = device_record("incremental")
    record["backend"] = kernels.update_backend(4)  # cpu (C++), pallas (a GPU's default) or xla
    record["note"] = ("time per generation of B chains (proposal + likelihood + accept), median of blocks run "
                      "in one jitted loop; compile apart")
    cases = [("DS1", "JC"), ("carnivores", "HKY+G4")]
    for name, model_name in cases:
        folder = SHARED_DATA / name
        if folder.exists():
            record["rows"].append(run_case(name, jp.read_alignment(folder / "alignment.fasta"),
                                           jp.parse_model(model_name), model_name, args.chains, args.generations,
                                           args.repeats))
    for taxa in args.taxa:
        names = [f"s{i}" for i in range(taxa)]
        model = jp.parse_model("HKY{2.0}+G4{0.5}")
        alignment = jp.simulate(jp.random_topology_tree(names, seed=1), model, 1000, seed=2)
        record["rows"].append(run_case(f"simulated-{taxa}", alignment, model, "HKY+G4", args.chains,
                                       args.generations, args.repeats))
    record["load_average_at_end"] = os.getloadavg()  # a shared machine: say how shared
    save(record, args.out, f"incremental-{record['backend']}")


if __name__ == "__main__":
    main()
