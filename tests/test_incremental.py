"""Incremental likelihoods (`likelihood.full_partials`, `proposed_partials`, `accept_partials`) against the full
recomputation (`batch_pattern_log_likelihoods`), over random sequences of MC³'s tree moves (NNI, SPR, extending
SPR and TBR, branch and tree-length multipliers, node slider; each chain its own move) accepted or rejected at
random: DS1 under JC69 by the C++ operation-list kernel, a simulated set under GTR+G4 by the XLA loop and by the
Pallas walk (each compiles the moves and both likelihoods: about 20 s of CPU).

Tolerance: 1e-10 relative on each chain's log-likelihood in float64. The two computations run the same
node steps on the same numbers but sum the log scale factors in another order (by node id, not by schedule
slot), so they differ by rounding only (measured: below 1e-15 relative). A rejected proposal must leave every
node's kept row bit for bit as it was. The count of nodes computed must equal the dirty set's size, and over
a run of local moves stay far below recomputing every node.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.inference.moves import propose_tree
from jaxphylo.likelihood import (
    accept_partials,
    batch_pattern_log_likelihoods,
    dirty_nodes,
    full_partials,
    kernels,
    max_step_width,
    operation_lists,
    pattern_data,
    proposed_partials,
    spectral_arrays,
)
from jaxphylo.tree import from_view, kernel_batch, kernel_children, phase_widths, to_view

CHAINS = 4
STEPS = 12
GTR = "GTR{1.2,3.4,0.8,1.1,4.0}+F{.3,.2,.2,.3}+G4{0.5}"
TREE_MOVES = 7  # TOPOLOGY_MOVES + BRANCH_MOVES


def alignment_of(name):
    if name == "DS1":
        return jp.read_alignment("/work/shared/data/DS1/alignment.fasta")
    taxa = [f"t{i}" for i in range(17)]
    return jp.simulate(jp.random_topology_tree(taxa, seed=3), jp.parse_model(GTR), 300, seed=5)


def chains(alignment, seed=0):
    return kernel_batch([jp.random_topology_tree(alignment.taxa, seed=seed + s) for s in range(CHAINS)])


@pytest.fixture(params=["cpp", "xla", "pallas", "levels"])
def backend(request, monkeypatch):
    """The operation-list kernel: C++, the XLA loop, the Pallas walk or a Pallas launch per dirty level
    (interpret mode on a CPU; the full recomputation it is compared with then runs Pallas's post-order too,
    itself checked against XLA's)."""
    if request.param == "cpp":
        if not (kernels.cpu_wanted() and kernels.cpu.has_update()):
            pytest.skip("the C++ kernel with the operation list is not built")
    else:
        monkeypatch.setattr(kernels._choice, "cpu_wanted", lambda: False)
    if request.param in ("pallas", "levels"):
        monkeypatch.setenv(kernels.KERNEL_ENV, "pallas")
        monkeypatch.setenv(kernels.UPDATE_ENV, "walk" if request.param == "pallas" else "levels")
        assert kernels.update_backend(4) == request.param
    return request.param


def proposals(parents, lengths, key, num_tips):
    """Each chain its own random tree move, through MC³'s moves on the tip-0 view."""
    k_kind, k_move = jax.random.split(key)
    up, edge = jax.vmap(to_view)(parents, lengths)
    kind = jax.random.randint(k_kind, (parents.shape[0],), 0, TREE_MOVES)
    up, edge, _ = jax.vmap(propose_tree, in_axes=(0, 0, 0, 0, None, None))(
        kind, jax.random.split(k_move, parents.shape[0]), up, edge, num_tips, jnp.ones(3))
    return jax.vmap(from_view)(up.astype(parents.dtype), edge, jnp.argmin(parents, axis=1).astype(parents.dtype))


def kept_rows(state):
    """Every internal node's valid rows `[B, N - 1, ...]` (partials, log scale factors)."""
    pick = lambda buffers: jnp.take_along_axis(  # noqa: E731
        buffers, state.current.astype(jnp.int32).reshape(state.current.shape[:1] + (1,) + state.current.shape[1:]
                                                         + (1,) * (buffers.ndim - 3)), axis=1)[:, 0]
    return pick(state.partials), pick(state.log_scales)


@pytest.mark.parametrize("name, model_string, backend",
                         [("DS1", "JC", "cpp"), ("simulated", GTR, "xla"), ("simulated", GTR, "pallas"),
                          ("simulated", GTR, "levels")], indirect=["backend"])
def test_incremental_matches_full_recomputation(name, model_string, backend):
    alignment, model = alignment_of(name), jp.parse_model(model_string)
    batch = chains(alignment)
    data, dtype = pattern_data(alignment, batch), jnp.float64
    widths = phase_widths(len(alignment.taxa), max_step_width(model, data, dtype, CHAINS))
    num_tips = len(alignment.taxa)
    weights = jnp.asarray(data.weights)

    @jax.jit
    def step(state, parents, lengths, key):
        k_move, k_accept = jax.random.split(key)
        new_parents, new_lengths = proposals(parents, lengths, k_move, num_tips)
        proposal, per_pattern = proposed_partials(state, model, new_parents, new_lengths, parents, lengths, data,
                                                  dtype)
        full = batch_pattern_log_likelihoods(model, new_parents, new_lengths, data, widths, dtype)
        accept = jax.random.bernoulli(k_accept, 0.5, (parents.shape[0],))
        dirty = jnp.sum(dirty_nodes(new_parents, new_lengths, parents, lengths), axis=1)
        kept = accept_partials(state, proposal, accept)
        parents = jnp.where(accept[:, None], new_parents, parents)
        lengths = jnp.where(accept[:, None], new_lengths, lengths)
        return kept, parents, lengths, per_pattern @ weights, full @ weights, accept, proposal.computed, dirty

    parents, lengths = batch.parents, batch.branch_lengths
    state, per_pattern = full_partials(model, parents, lengths, data, dtype)
    start = batch_pattern_log_likelihoods(model, parents, lengths, data, widths, dtype)
    np.testing.assert_allclose(per_pattern @ weights, start @ weights, rtol=1e-10)
    key, computed, accepted = jax.random.PRNGKey(1), 0, 0
    for _ in range(STEPS):
        key, k = jax.random.split(key)
        before = kept_rows(state)
        state, parents, lengths, ours, full, accept, count, dirty = step(state, parents, lengths, k)
        np.testing.assert_allclose(ours, full, rtol=1e-10)
        np.testing.assert_array_equal(count, dirty)
        after = kept_rows(state)
        for b in np.flatnonzero(~np.asarray(accept)):
            for old, new in zip(before, after):
                np.testing.assert_array_equal(old[b], new[b])
        computed += int(jnp.sum(count))
        accepted += int(jnp.sum(accept))
    assert 0 < accepted < STEPS * CHAINS
    # Tree-length multipliers touch every node; the other six moves a path or two.
    assert computed < 0.7 * STEPS * CHAINS * (num_tips - 1), computed


def test_model_changes_and_per_tree_models(backend):
    """Chains whose model changed (`every_node`) recompute every node, under a model per chain."""
    alignment = alignment_of("simulated")
    batch = chains(alignment, seed=7)
    data, dtype = pattern_data(alignment, batch), jnp.float64
    widths = phase_widths(len(alignment.taxa), max_step_width(jp.parse_model(GTR), data, dtype, CHAINS))
    models = [jp.parse_model(f"GTR{{1.2,3.4,0.8,1.1,4.0}}+F{{.3,.2,.2,.3}}+G4{{{a}}}") for a in (0.3, 0.5, 1.0, 2.0)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *models)
    changed = jax.tree.map(lambda *x: jnp.stack(x), *(models[1:] + models[:1]))
    parents, lengths = batch.parents, batch.branch_lengths
    state, _ = jax.jit(lambda *a: full_partials(*a, data, dtype, per_tree_models=True))(stacked, parents, lengths)
    moved = jnp.array([True, False, True, False])
    mixed = jax.tree.map(lambda new, old: jnp.where(moved.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
                         changed, stacked)
    new_parents, new_lengths = proposals(parents, lengths, jax.random.PRNGKey(2), len(alignment.taxa))
    proposal, per_pattern = jax.jit(lambda *a: proposed_partials(*a, data, dtype, per_tree_models=True,
                                                                 every_node=moved))(
        state, mixed, new_parents, new_lengths, parents, lengths)
    full = batch_pattern_log_likelihoods(mixed, new_parents, new_lengths, data, widths, dtype, per_tree_models=True)
    np.testing.assert_allclose(per_pattern @ data.weights, full @ data.weights, rtol=1e-10)
    assert np.all(np.asarray(proposal.computed)[np.asarray(moved)] == len(alignment.taxa) - 1)


def test_level_schedule_orders_every_listed_node_once_after_its_children():
    """A launch per level (`kernels.level_schedule`, `level_row`): every listed node in exactly one launch, after
    the launches of its listed children, at most `width` per chain and launch; checked on the operation lists of
    random trees where a chain recomputes every node, a path, or nothing."""
    alignment = alignment_of("simulated")
    batch = chains(alignment, seed=11)
    parents, lengths = batch.parents, batch.branch_lengths
    num_tips = len(alignment.taxa)
    new_parents, new_lengths = proposals(parents, lengths, jax.random.PRNGKey(4), num_tips)
    new_lengths = new_lengths.at[3].set(lengths[3])  # the last chain: nothing changed
    new_parents = new_parents.at[3].set(parents[3])
    dirty = dirty_nodes(new_parents, new_lengths, parents, lengths, jnp.array([True, False, False, False]))
    operations, counts, depths = operation_lists(new_parents, dirty)
    for width in (1, 2, 3):
        launch, slot, launches = kernels.level_schedule(counts, depths, width)
        table = np.stack([kernels.level_row(operations, launch, slot, i, width) for i in range(int(launches) + 1)])
        launches = int(launches)
        assert np.all(table[launches:] == -1)
        children = np.asarray(jax.vmap(kernel_children)(new_parents))
        for b in range(CHAINS):
            listed = list(np.asarray(operations[b, : counts[b]]))
            at = {int(v): launch for launch in range(launches) for v in table[launch, b] if v >= 0}
            assert sorted(at) == sorted(int(v) for v in listed)
            assert max(np.sum(table[:launches, b] >= 0, axis=1)) <= width
            for v in listed:
                assert all(at[v] > at[c] for c in children[b, v] if c in at)
    assert int(counts[0]) == num_tips - 1 and int(counts[3]) == 0


def test_dirty_set_of_one_length_change_is_the_path_to_the_root():
    """A branch-length change above node v dirties v's parent and its ancestors, nothing else."""
    parents = jnp.array([[4, 4, 5, 6, 5, 6, -1]])  # ((0,1)4,2)5,3)6
    lengths = jnp.ones((1, 7))
    dirty = dirty_nodes(parents, lengths.at[0, 0].set(2.0), parents, lengths)
    np.testing.assert_array_equal(np.flatnonzero(dirty[0]), [4, 5, 6])
    dirty = dirty_nodes(parents, lengths.at[0, 3].set(2.0), parents, lengths)
    np.testing.assert_array_equal(np.flatnonzero(dirty[0]), [6])
    swapped = jnp.array([[4, 5, 4, 6, 5, 6, -1]])  # NNI: tips 1 and 2 exchanged
    np.testing.assert_array_equal(np.flatnonzero(dirty_nodes(swapped, lengths, parents, lengths)[0]), [4, 5, 6])


def test_a_generation_updates_the_buffers_in_place():
    """Compiled with the state donated, proposal + accept holds no copy of the partials buffers."""
    alignment = alignment_of("simulated")
    batch = chains(alignment, seed=11)
    data, dtype, model = pattern_data(alignment, batch), jnp.float64, jp.parse_model("JC")
    parents, lengths = batch.parents, batch.branch_lengths
    state, _ = full_partials(model, parents, lengths, data, dtype)

    def generation(state, new_lengths, accept):
        proposal, per_pattern = proposed_partials(state, model, parents, new_lengths, parents, lengths, data, dtype)
        return accept_partials(state, proposal, accept), per_pattern

    text = jax.jit(generation, donate_argnums=0).lower(state, lengths * 1.1, jnp.ones(CHAINS, bool)).compile().as_text()
    for buffers in (state.partials, state.log_scales):
        shape = ",".join(str(d) for d in buffers.shape)
        assert not [line for line in text.splitlines() if f"[{shape}]" in line and " copy(" in line]


@pytest.mark.parametrize("name, model_string", [("simulated", GTR), ("DS1", "JC")])
def test_fused_generations_equal_one_generation_at_a_time(name, model_string):
    """tgMC³'s fused kernel (`kernels.fused_generations`: G generations per chain in one launch, each a branch
    multiplier or a stochastic NNI, interpreted on a CPU) against the same generations made one at a time with
    every node recomputed (`batch_pattern_log_likelihoods`), from the same draws: the same accept decisions and
    trees, lengths to the ulp, log L within 1e-10 relative, and kept partials that give it; heated chains,
    GTR+G4 on simulated data and JC on DS1."""
    alignment, model = alignment_of(name), jp.parse_model(model_string)
    batch = chains(alignment, seed=5)
    data, dtype = pattern_data(alignment, batch), jnp.float64
    widths = phase_widths(len(alignment.taxa), max_step_width(model, data, dtype, CHAINS))
    parents, lengths = batch.parents, batch.branch_lengths
    b, m = parents.shape
    num_tips, generations, rate = len(alignment.taxa), 8, 10.0
    weights = jnp.asarray(data.weights)
    full = lambda p, x: batch_pattern_log_likelihoods(model, p, x, data, widths, dtype) @ weights  # noqa: E731
    k_kind, k_edge, k_side, k_m, k_u = jax.random.split(jax.random.PRNGKey(8), 5)
    kinds = jax.random.bernoulli(k_kind, 0.5, (b, generations)).astype(jnp.int32)
    root = np.asarray(jnp.argmin(parents, axis=1))
    # NNI: internal nodes other than the root and its children (ids stay internal under NNIs); multiplier: any
    # non-root node. The same draw picks either.
    internal = [np.array([v for v in range(num_tips, m) if v != root[c] and parents[c, v] != root[c]])
                for c in range(b)]
    anywhere = [np.array([v for v in range(m) if v != root[c]]) for c in range(b)]
    pick = np.asarray(jax.random.uniform(k_edge, (b, generations)))
    edges = np.array([[(internal[c] if kinds[c, g] else anywhere[c])[int(pick[c, g] * len(
        internal[c] if kinds[c, g] else anywhere[c]))] for g in range(generations)] for c in range(b)])
    sides = jax.random.bernoulli(k_side, 0.5, (b, generations)).astype(jnp.int32)
    log_m = 2 * np.log(2) * (jax.random.uniform(k_m, (b, generations)) - 0.5)
    log_u = jnp.log(jax.random.uniform(k_u, (b, generations)))
    beta = jnp.array([1.0, 1 / 1.1, 1 / 1.2, 1 / 1.3])

    state, per_pattern = full_partials(model, parents, lengths, data, dtype)
    out = kernels.fused_generations(
        *spectral_arrays(model, dtype, batch=b), data.tip_codes, data.tip_table, data.weights, parents, lengths,
        state.partials, state.log_scales, state.current, per_pattern @ weights, beta, kinds, edges, sides, log_m,
        log_u, rate, interpret=True)
    new_parents, new_lengths, partials, log_scales, buffer, log_likelihood, accepted = out

    tree_parents, tree_lengths = np.array(parents), np.array(lengths)
    kids = np.array(jax.vmap(kernel_children)(parents))  # slot order as the kernel keeps it
    current, count = np.array(full(parents, lengths)), np.zeros((b, 2), int)
    for g in range(generations):
        proposed = [tree_parents.copy(), tree_lengths.copy(), kids.copy()]
        for c in range(b):
            e = edges[c, g]
            if kinds[c, g]:
                p, _, k = proposed
                u, x = p[c, e], kids[c, e, sides[c, g]]
                s = k[c, u, 1] if k[c, u, 0] == e else k[c, u, 0]
                p[c, x], p[c, s] = u, e
                k[c, e, sides[c, g]] = s
                k[c, u, list(k[c, u]).index(s)] = x
            else:
                proposed[1][c, e] *= np.exp(log_m[c, g])
        value = np.asarray(full(jnp.asarray(proposed[0]), jnp.asarray(proposed[1])))
        for c in range(b):
            moved = proposed[1][c, edges[c, g]] - tree_lengths[c, edges[c, g]]
            ratio = beta[c] * (value[c] - current[c] - rate * moved) + (0.0 if kinds[c, g] else log_m[c, g])
            if log_u[c, g] < ratio:
                tree_parents[c], tree_lengths[c], kids[c] = proposed[0][c], proposed[1][c], proposed[2][c]
                current[c] = value[c]
                count[c, kinds[c, g]] += 1
    np.testing.assert_array_equal(accepted, count)
    assert count[:, 0].sum() > 0 and count[:, 1].sum() > 0 and count.sum() < b * generations
    np.testing.assert_array_equal(new_parents, tree_parents)
    np.testing.assert_allclose(new_lengths, tree_lengths, rtol=1e-14)  # exp(log m): XLA's against NumPy's, an ulp
    np.testing.assert_allclose(log_likelihood, current, rtol=1e-10)
    kept = kernels.kept_log_likelihoods(partials, log_scales, buffer.astype(jnp.int32), jnp.argmin(new_parents, 1),
                                          jnp.broadcast_to(model.substitution.frequencies, (b, 4)),
                                          jnp.broadcast_to(model.rate_categories()[1], (b, len(
                                              model.rate_categories()[1]))), num_tips)
    np.testing.assert_allclose(kept @ weights, current, rtol=1e-10)
