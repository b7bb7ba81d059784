"""End-to-end check of the Pallas kernels on a GPU against the XLA kernels, through the public API.

    python validation/pallas_gpu/smoke.py DATA_DIR OUT.json      (SMOKE_QUICK=1: no search, no MC³)

Runs each case once under JAXPHYLO_KERNEL=xla and once under =pallas (two subprocesses, so that every
jitted program is traced under its kernel) and compares: DS1 log L and branch-length gradient (float64
and float32), codon and amino-acid log L and gradient on carnivores (the blocks kernels), a two-part partitioned log L and gradient (parts vmapped), a batch of 16 trees (steps
kernels, 27 taxa walk), an ML search (NNI + SPR, patience 1) and a short MC³ run. Writes both sides and
their differences to OUT.json.
"""
import json, os, subprocess, sys, time

def side(data, kernel):
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxphylo as jp
    from jaxphylo import ml, inference
    out = {"kernel": kernel, "device": str(jax.devices()[0])}
    aln = jp.read_alignment(f"{data}/DS1/alignment.fasta")
    tree = jp.read_tree(f"{data}/DS1/tree.nwk")
    model = jp.parse_model("HKY{2}+F{0.3,0.2,0.2,0.3}+G4{0.5}")
    for precision in ("float64", "float32"):
        t = time.perf_counter()
        v, g = jax.value_and_grad(lambda b: jp.log_likelihood(aln, eqx_replace(tree, b), model, precision=precision))(tree.branch_lengths)
        out[f"loglik_{precision}"] = float(v); out[f"grad_{precision}"] = np.asarray(g).tolist()
        out[f"seconds_{precision}"] = time.perf_counter() - t
    path = "/tmp/parts.nex"
    open(path, "w").write("#nexus\nbegin sets;\n charset a = 1-500;\n charset b = 501-934;\nend;\n")
    pm = jp.partitioned_model(jp.read_partitions(path), aln, "HKY+G4")
    v, g = jax.value_and_grad(lambda b: jnp.sum(jp.partitioned_log_likelihoods(aln, eqx_replace(tree, b), pm)))(tree.branch_lengths)
    out["partitioned"] = float(v); out["partitioned_grad"] = np.asarray(g).tolist()
    for label, alignment, states_model in _large_state_cases(data):  # the matrix-product (blocks) kernels
        t = time.perf_counter()
        big_tree = jp.read_tree(f"{data}/carnivores/tree.nwk")
        v, g = jax.value_and_grad(lambda b: jp.log_likelihood(alignment, eqx_replace(big_tree, b), states_model))(
            big_tree.branch_lengths)
        out[f"loglik_{label}"] = float(v); out[f"grad_{label}"] = np.asarray(g).tolist()
        out[f"seconds_{label}"] = time.perf_counter() - t
    names = list(aln.taxa)
    batch = jp.TreeBatch.from_trees([jp.random_topology_tree(names, seed=s, mean_branch_length=0.05) for s in range(16)])
    out["batch"] = np.asarray(jp.log_likelihood(aln, batch, model)).tolist()
    if os.environ.get("SMOKE_QUICK"):
        return out
    t = time.perf_counter()
    result = ml.search(aln, "HKY+G4", seed=1, settings=ml.SearchSettings(patience=1))
    out["search_loglik"] = float(result.log_likelihood); out["search_seconds"] = time.perf_counter() - t
    subprocess.run([sys.executable, "-m", "jaxphylo.cli", "mcmc", f"{data}/DS1/alignment.fasta", "--model", "HKY+G4",
                    "--runs", "1", "--chains", "2", "--generations", "200", "--sample-every", "50", "--seed", "1",
                    "-o", f"/tmp/mcmc_{kernel}"], check=True, env=dict(os.environ), capture_output=True)
    log = np.genfromtxt(f"/tmp/mcmc_{kernel}/run1.log", names=True, delimiter="\t")
    column = next(n for n in log.dtype.names if n.lower() in ("lnl", "loglik", "likelihood"))
    out["mcmc_first_loglik"] = float(log[column][0]); out["mcmc_last_loglik"] = float(log[column][-1])
    return out

def _large_state_cases(data):
    """Carnivores as codons (sense codons of NCBI table 2 only, GY94+F3x4+G4) and translated (mtREV+G4)."""
    import jaxphylo as jp
    from Bio.Data import CodonTable
    dna = jp.read_alignment(f"{data}/carnivores/alignment.fasta")
    sense = set(jp.codon_alphabet(2).states)
    keep = [i for i in range(0, len(dna.sequences[0]) - 2, 3) if all(s[i:i + 3] in sense for s in dna.sequences)]
    codons = [[s[i:i + 3] for i in keep] for s in dna.sequences]
    table = CodonTable.unambiguous_dna_by_id[2].forward_table
    codon_alignment = jp.Alignment(dna.taxa, tuple("".join(c) for c in codons), jp.codon_alphabet(2))
    return [("codons", codon_alignment,
             jp.parse_model("GY{kappa=2,omega=0.3}+F3X4+G4{0.5}", alignment=codon_alignment, genetic_code=2)),
            ("amino_acids", jp.Alignment(dna.taxa, tuple("".join(table[x] for x in c) for c in codons), jp.PROTEIN),
             jp.parse_model("mtREV+G4{0.5}"))]

def eqx_replace(tree, lengths):
    import equinox as eqx
    return eqx.tree_at(lambda t: t.branch_lengths, tree, lengths)

if __name__ == "__main__":
    if sys.argv[1] == "--side":
        print(json.dumps(side(sys.argv[2], sys.argv[3])))
        raise SystemExit
    data, target = sys.argv[1], sys.argv[2]
    sides = {}
    for kernel in ("xla", "pallas"):
        env = dict(os.environ, JAXPHYLO_KERNEL=kernel)
        done = subprocess.run([sys.executable, __file__, "--side", data, kernel], env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:]); raise SystemExit(1)
        sides[kernel] = json.loads(done.stdout.strip().splitlines()[-1])
    import numpy as np
    x, p = sides["xla"], sides["pallas"]
    rel = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(np.asarray(b))), 1e-300))
    diffs = {k: rel(p[k], x[k]) for k in x if k not in ("kernel", "device") and not k.endswith("seconds") and not k.startswith("seconds")}
    json.dump({"sides": sides, "relative_differences": diffs}, open(target, "w"), indent=1)
    for k, v in diffs.items():
        print(f"{k:24s} {v:.2e}")
    if "search_seconds" in x:
        print("seconds xla / pallas: search", round(x["search_seconds"], 1), round(p["search_seconds"], 1))
