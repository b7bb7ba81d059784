"""Does Pallas-on-Triton take float64/float32 matrix products of `[T, S] x [S, S]` blocks, and how fast?

    python benchmarks/triton_dot_probe.py        (a GPU; writes $OUT or benchmarks/results/triton_dot_probe-gpu.json)

The sizes of the codon and amino-acid kernels (`_pallas_blocks.py`): a program per `[T, S]` block does,
per category, `x P^T` and `m^T x`, as the passes do. Chose their tile (2,048 elements per block) and
showed that Triton's default float32 product is TF32 (3e-4 relative): the kernels ask for full precision.
"""
import functools, json, os, time
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt
jax.config.update("jax_enable_x64", True)

def kernel(x_ref, p_ref, o_ref, d_ref, *, cats, trans_a):
    i = pl.program_id(0)
    def body(r, acc):
        x = x_ref[i, r]
        m = plt.dot(x, p_ref[r], trans_b=True)
        o_ref[i, r] = m
        d_ref[i, r] = plt.dot(m, x, trans_a=True) if trans_a else d_ref[i, r]
        return jnp.maximum(acc, jnp.max(m, axis=1))
    acc = lax.fori_loop(0, cats, body, jnp.zeros(x_ref.shape[2], x_ref.dtype))
    o_ref[i, 0] = o_ref[i, 0] / acc[:, None]

def run(dtype, T, S, n, cats=4, warps=4, trans_a=True):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((n, cats, T, S)), dtype)
    p = jnp.asarray(rng.random((cats, S, S)), dtype)
    call = pl.pallas_call(functools.partial(kernel, cats=cats, trans_a=trans_a),
        out_shape=(jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct((n, cats, S, S), dtype)),
        grid=(n,), compiler_params=plt.CompilerParams(num_warps=warps, num_stages=1))
    f = jax.jit(call)
    t0 = time.perf_counter(); o, d = f(x, p); o.block_until_ready(); compile_s = time.perf_counter() - t0
    m = jnp.einsum("ncts,csu->nctu", x, jnp.swapaxes(p, 1, 2), precision="highest")
    acc = jnp.max(m, axis=(1, 3))
    want = m.at[:, 0].divide(acc[:, :, None])
    err = float(jnp.max(jnp.abs(o - want) / jnp.abs(want)))
    derr = float(jnp.max(jnp.abs(d - jnp.einsum("ncts,nctu->ncsu", m, x, precision="highest")))) if trans_a else None
    ts = []
    for _ in range(20):
        t0 = time.perf_counter(); f(x, p)[0].block_until_ready(); ts.append(time.perf_counter() - t0)
    ms = 1e3 * float(np.median(ts))
    flops = 2 * n * cats * T * S * S * (2 if trans_a else 1)
    bytes_ = x.nbytes * 2 + (n * cats * S * S * jnp.dtype(dtype).itemsize if trans_a else 0)
    return dict(dtype=str(jnp.dtype(dtype)), T=T, S=S, n=n, warps=warps, trans_a=trans_a, compile_s=compile_s,
                ms=ms, rel_err=err, d_err=derr, TFLOPs=flops / ms / 1e9, GBps=bytes_ / ms / 1e6)

rows = []
for dtype in (jnp.float64, jnp.float32):
    for T, S, warps in [(16, 64, 4), (32, 64, 4), (64, 64, 4), (32, 32, 4), (64, 32, 4), (32, 64, 8), (128, 32, 4)]:
        n = (3600 // T) * 61
        try:
            r = run(dtype, T, S, n, warps=warps)
        except Exception as e:
            r = dict(dtype=str(jnp.dtype(dtype)), T=T, S=S, warps=warps, error=(str(e).strip().splitlines() or [repr(e)])[0][:300])
        print(json.dumps(r), flush=True); rows.append(r)
out = os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results"))
json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows),
          open(os.path.join(out, "triton_dot_probe-gpu.json"), "w"), indent=1)
