"""What a new user stumbles on (issue #14): short reprs, an unconstrained model view, binary input,
PhyloCTMC.sample under Predictive, and no deprecation warning on the documented NumPyro path."""

import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from scipy import stats

import jaxphylo as jp
from jaxphylo.inference import PhyloCTMC, pattern_data

from conftest import dataset


# 1. Short summaries --------------------------------------------------------------------------------

def test_alignment_repr_is_a_summary_and_equality_is_unchanged():
    fasta, _ = jp.example_paths()
    alignment = jp.read_alignment(fasta)
    patterns = alignment.site_patterns().num_patterns
    assert repr(alignment) == f"Alignment(16 taxa, 600 sites, {patterns} patterns, DNA, source={str(fasta)!r})"
    assert repr(alignment.site_patterns()) == f"SitePatterns(16 taxa, {patterns} patterns of 600 sites, DNA)"
    same = jp.Alignment(alignment.taxa, alignment.sequences, alignment.alphabet)  # source takes no part
    assert same == alignment and hash(same) == hash(alignment)
    assert jp.Alignment(("a", "b"), ("ACG", "ACT"), jp.DNA) != jp.Alignment(("a", "b"), ("ACG", "ACG"), jp.DNA)
    codons = jp.Alignment(("a", "b"), ("ATGAAA", "ATGCCC"), jp.codon_alphabet(2))
    assert repr(codons) == "Alignment(2 taxa, 2 sites, 2 patterns, codon (genetic code 2), source='<memory>')"


def test_tree_reprs_are_summaries_also_under_jit_and_vmap():
    tree = jp.parse_newick("((a:0.1,b:0.2):0.05,c:0.3,d:0.25);")
    assert repr(tree) == "Tree(4 taxa, unrooted, length 0.9)"
    assert repr(tree.topology) == "Topology(4 taxa, unrooted)"
    assert repr(jp.parse_newick("((a:1,b:2):1,c:0.5);")) == "Tree(3 taxa, rooted, length 4.5)"
    batch = jp.TreeBatch.from_trees([tree] * 8)
    assert repr(batch) == "TreeBatch(8 trees, 4 taxa)"
    seen = []
    jax.jit(lambda t: seen.append(repr(t)) or t.tree_length)(tree)
    jax.vmap(lambda lengths: seen.append(repr(tree.with_branch_lengths(lengths))) or 0.0)(jnp.ones((3, 6)))
    jax.jit(lambda b: seen.append(repr(b)) or 0.0)(batch)
    assert seen == ["Tree(4 taxa, unrooted, traced lengths of shape (6,))"] * 2 + ["TreeBatch(8 trees, 4 taxa)"]
    assert repr(eqx.filter(tree, eqx.is_array, inverse=True)) == "Tree(4 taxa, unrooted, lengths NoneType)"
    again = jp.parse_newick("((a:0.3,b:0.2):0.05,c:0.3,d:0.25);")  # equality and hash follow the shape only
    assert again.topology == tree.topology and hash(again.topology) == hash(tree.topology)


# 2. An unconstrained view of a model ----------------------------------------------------------------

@pytest.mark.parametrize("string", ["GTR+G4", "GTR{1,2,3,4,5,1}+I{0.2}+R3", "TIM2+I+G4", "HKY+FO", "TN+FO+R2",
                                    "K3P+G4", "JC+I", "LG+G4", "GY+FQ"])
def test_unconstrain_round_trip(string):
    alignment = jp.read_alignment(jp.example_paths()[0])
    model = jp.parse_model(string) if string.startswith(("LG", "GY")) else jp.parse_model(string, alignment=alignment)
    params, rebuild = jp.unconstrain(model)
    rebuilt = rebuild(params)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(model)
    for got, want in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(model)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    assert all(jnp.issubdtype(v.dtype, jnp.floating) and v.ndim <= 1 for v in params.values())
    # any real coordinates give a valid model
    shifted = jax.tree.map(lambda u: u + 3.0 * jnp.sin(jnp.arange(u.size, dtype=float).reshape(u.shape) + 1), params)
    moved = jax.jit(lambda p, r: r(p))(shifted, rebuild)
    assert np.isclose(float(jnp.sum(moved.frequencies)), 1.0) and bool(jnp.all(moved.frequencies > 0))
    rates, weights = moved.rate_categories()
    assert np.isclose(float(jnp.sum(weights)), 1.0) and np.isclose(float(jnp.sum(weights * rates)), 1.0)


def test_unconstrain_chooses_free_parameters():
    params, _ = jp.unconstrain(jp.parse_model("K80+G4"))
    assert set(params) == {"kappa", "gamma_shape"}  # K80's frequencies are equal by definition
    params, _ = jp.unconstrain(jp.parse_model("GTR+G4"), estimate={"gamma_shape"})
    assert set(params) == {"gamma_shape"}
    with pytest.raises(jp.ModelError, match="unknown parameter group 'shape'"):
        jp.unconstrain(jp.parse_model("GTR+G4"), estimate={"shape"})


def test_adam_through_unconstrain_stays_finite_on_ds1():
    folder = dataset("DS1")
    alignment, tree = jp.read_alignment(folder / "alignment.fasta"), jp.read_tree(folder / "tree.nwk")
    model = jp.parse_model("GTR+G4", alignment=alignment)
    data = pattern_data(alignment, tree)
    optimizer = optax.adam(0.05)

    @jax.jit
    def step(params, state, rebuild, data):
        loss, grads = jax.value_and_grad(lambda p: -jp.likelihood.data_log_likelihood(data, tree, rebuild(p)))(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    params, rebuild = jp.unconstrain(model)
    state, losses = optimizer.init(params), []
    for _ in range(60):
        params, state, loss = step(params, state, rebuild, data)
        losses.append(float(loss))
    final = rebuild(params)
    log_l = float(jp.log_likelihood(alignment, tree, final))
    assert np.all(np.isfinite(losses)) and np.isfinite(log_l)
    assert log_l > -losses[0] + 100  # DS1: -6710.5 at the start, about -6494 after 60 steps
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(final))


# 3. Binary files -----------------------------------------------------------------------------------

@pytest.fixture
def binary_files(tmp_path):
    rng = np.random.default_rng(0)
    with_nul = tmp_path / "random.bin"
    with_nul.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    not_utf8 = tmp_path / "latin.bin"
    not_utf8.write_bytes(b">a\nAC\xff\xfeGT\n")
    return with_nul, not_utf8


def test_binary_input_is_an_input_error(binary_files):
    for path in binary_files:
        for reader, what in ((jp.read_alignment, "alignment"), (jp.read_tree, "tree")):
            with pytest.raises(jp.InputError) as caught:
                reader(path)
            message = str(caught.value)
            assert message.startswith(f"{path}: cannot read {what}: not a text file") and "\n" not in message


def test_binary_input_on_the_command_line(binary_files):
    fasta, newick = jp.example_paths()
    for arguments in ((binary_files[0], newick), (fasta, binary_files[1])):
        done = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "loglik", *map(str, arguments), "-m", "JC"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr and "not a text file" in lines[0], done.stderr


# 4. PhyloCTMC.sample under Predictive --------------------------------------------------------------

THREE_TAXA = "((a:0.15,b:0.4):0.1,c:0.7);"


def _site_model(kappa):
    return jp.Model(jp.models.HKY85(kappa, jnp.array([0.1, 0.2, 0.3, 0.4])),
                    jp.models.InvariantSites(jnp.asarray(0.2), jp.models.DiscreteGamma(jnp.asarray(0.5), 4)))


def _predictive_model(tree, data=None, num_sites=None):
    kappa = numpyro.sample("kappa", dist.LogNormal(1.0, 0.5))
    numpyro.sample("alignment", PhyloCTMC(tree, _site_model(kappa), num_sites=num_sites), obs=data)


def test_predictive_simulates_alignments_that_log_prob_accepts():
    tree = jp.parse_newick(THREE_TAXA)
    draws = numpyro.infer.Predictive(_predictive_model, num_samples=3)(jax.random.key(0), tree, num_sites=200)
    simulated = draws["alignment"]
    assert simulated.tip_codes.shape == (3, 4, 200) and simulated.weights.shape == (3, 200)
    for k in range(3):
        one = jax.tree.map(lambda leaf: leaf[k], simulated)
        log_p = PhyloCTMC(tree, _site_model(draws["kappa"][k])).log_prob(one)
        assert np.isfinite(float(log_p)) and float(log_p) < 0
    assert not np.array_equal(simulated.tip_codes[0], simulated.tip_codes[1])
    with pytest.raises(jp.ModelError, match="num_sites"):
        PhyloCTMC(tree, _site_model(2.0)).sample(jax.random.key(0))
    batch = PhyloCTMC(tree, _site_model(2.0), num_sites=5).sample(jax.random.key(0), (2, 3))
    assert batch.tip_codes.shape == (2, 3, 4, 5)


def test_simulated_pattern_frequencies_match_the_likelihood():
    tree, model, sites = jp.parse_newick(THREE_TAXA), _site_model(jnp.asarray(3.0)), 40_000
    data = PhyloCTMC(tree, model, num_sites=sites).sample(jax.random.key(7))
    tips = np.asarray(data.tip_codes[:3])
    # every one of the 64 patterns, by the likelihood of a 64-column alignment
    patterns = np.array(np.meshgrid(range(4), range(4), range(4), indexing="ij")).reshape(3, -1)
    columns = jp.Alignment(tree.taxa, tuple("".join("ACGT"[s] for s in row) for row in patterns), jp.DNA)
    expected = np.exp(np.asarray(jp.pattern_log_likelihoods(columns, tree, model)))
    site_pattern = np.asarray(columns.site_patterns().site_pattern)
    expected = expected[site_pattern]  # back from compressed patterns to the 64 columns
    assert np.isclose(expected.sum(), 1.0)
    constant = (tips[0] == tips[1]) & (tips[1] == tips[2])
    p_constant = expected[np.all(patterns == patterns[0], axis=0)].sum()  # AAA, CCC, GGG, TTT
    assert abs(constant.mean() - p_constant) < 4 * np.sqrt(p_constant * (1 - p_constant) / sites)
    counts = np.bincount(tips[0] * 16 + tips[1] * 4 + tips[2], minlength=64)
    chi2 = np.sum((counts - sites * expected) ** 2 / (sites * expected))
    assert chi2 < stats.chi2.ppf(1 - 1e-4, 63), chi2


# 5. No warning on the documented NumPyro path -------------------------------------------------------

def test_readme_sample_example_emits_no_warning():
    fasta, newick = jp.example_paths()
    alignment, tree = jp.read_alignment(fasta), jp.read_tree(newick)

    def model(data):
        lengths = numpyro.sample("branch_lengths",
                                 dist.Exponential(10.0).expand([tree.topology.num_nodes - 1]).to_event(1))
        kappa = numpyro.sample("kappa", dist.LogNormal(1.0, 1.25))
        substitution = jp.models.Model(jp.models.HKY85(kappa, jnp.full(4, 0.25)))
        numpyro.sample("alignment", PhyloCTMC(tree.with_branch_lengths(jnp.append(lengths, 0.0)), substitution),
                       obs=data)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(model), num_warmup=3, num_samples=3, progress_bar=False)
        mcmc.run(jax.random.key(0), pattern_data(alignment, tree))
        assert np.all(np.isfinite(mcmc.get_samples()["kappa"]))
        # the alignment itself as obs: the same model checks, run by NumPyro's initialisation
        numpyro.infer.util.initialize_model(jax.random.key(1), model, model_args=(alignment,))
