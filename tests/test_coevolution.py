"""Mutual information against brute-force histograms; the shuffling null model."""

import math

import jax
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.coevolution import _mutual_information as mi_module


def entropy(*columns):
    _, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    p = counts / counts.sum()
    return float(-np.sum(p * np.log(p)))


@pytest.fixture(scope="module")
def alignment():
    rng = np.random.default_rng(0)
    base = rng.choice(list("ACGT-NR"), (30, 14), p=[.3, .2, .2, .2, .04, .03, .03])
    base[:, 5] = np.where(base[:, 2] == "A", "G", base[:, 5])  # a coupled pair
    base[:, 9] = "C"  # a constant column
    return jp.Alignment(tuple(f"s{i}" for i in range(30)), tuple("".join(r) for r in base), jp.DNA)


def test_symbols_are_states_gap_and_unknown(alignment):
    symbols, k = jp.coevolution.column_symbols(alignment)
    assert k == 6
    raw = np.array([list(s) for s in alignment.sequences])
    expected = np.select([raw == c for c in "ACGT-"], range(5), default=5)
    np.testing.assert_array_equal(symbols, expected)


def test_two_point_matches_brute_force_and_diagonal_is_entropy(alignment):
    result = jp.coevolution.mutual_information(alignment, order=2, shuffles=50, seed=3)
    s, _ = jp.coevolution.column_symbols(alignment)
    length = s.shape[1]
    for i in range(length):
        assert result.mi[i, i] == pytest.approx(entropy(s[:, i]), abs=1e-10)
        for j in range(length):
            expected = entropy(s[:, i]) + entropy(s[:, j]) - entropy(s[:, i], s[:, j])
            assert abs(result.mi[i, j] - expected) < 1e-10
    np.testing.assert_allclose(result.entropy, np.diagonal(result.mi))
    assert result.zscore[2, 5] > 3 and result.percentile[2, 5] > 95  # the coupled pair stands out
    assert abs(result.mi[9, 3]) < 1e-12 and result.zscore[9, 3] == 0 and result.null_std[9, 3] < 1e-7
    bits = jp.coevolution.mutual_information(alignment, order=2, shuffles=50, seed=3, base=2)
    np.testing.assert_allclose(bits.mi, result.mi / math.log(2), rtol=1e-12)
    np.testing.assert_allclose(bits.zscore, result.zscore, rtol=1e-9, atol=1e-12)


def test_three_point_matches_brute_force(alignment):
    result = jp.coevolution.mutual_information(alignment, order=3, shuffles=20, seed=1)
    s, _ = jp.coevolution.column_symbols(alignment)
    for i, j, k in [(0, 1, 2), (2, 5, 7), (3, 3, 8), (4, 4, 4), (13, 0, 6)]:
        h = entropy
        expected = (h(s[:, i]) + h(s[:, j]) + h(s[:, k]) - h(s[:, i], s[:, j]) - h(s[:, i], s[:, k])
                    - h(s[:, j], s[:, k]) + h(s[:, i], s[:, j], s[:, k]))
        assert abs(result.mi[i, j, k] - expected) < 1e-10
    assert result.mi[4, 4, 4] == pytest.approx(entropy(s[:, 4]), abs=1e-10)


def test_three_point_blocks_agree_with_one_block(alignment, monkeypatch):
    whole = jp.coevolution.mutual_information(alignment, order=3, shuffles=8, seed=2)
    monkeypatch.setattr(mi_module, "BATCH_BYTES", 14 * 6**3 * 12 * 5)  # forces 5-wide blocks
    assert mi_module._blocks(14, 6, 3)[1] < 14
    blocked = jp.coevolution.mutual_information(alignment, order=3, shuffles=8, seed=2)
    np.testing.assert_allclose(blocked.mi, whole.mi, atol=1e-12)
    np.testing.assert_allclose(blocked.null_mean, whole.null_mean, atol=1e-12)


def test_shuffles_keep_each_column_composition_and_seed_reproduces(alignment):
    s, _ = jp.coevolution.column_symbols(alignment)
    shuffled = np.asarray(mi_module._shuffle(jax.random.key(7), jax.numpy.asarray(s)))
    assert not np.array_equal(shuffled, s)
    for column in range(s.shape[1]):
        assert sorted(shuffled[:, column]) == sorted(s[:, column])
    a = jp.coevolution.mutual_information(alignment, shuffles=30, seed=5)
    b = jp.coevolution.mutual_information(alignment, shuffles=30, seed=5, batch=7)
    np.testing.assert_allclose(a.null_mean, b.null_mean, atol=1e-12)  # batches sum in another order
    np.testing.assert_array_equal(a.percentile, b.percentile)
    c = jp.coevolution.mutual_information(alignment, shuffles=30, seed=6)
    assert not np.array_equal(a.null_mean, c.null_mean)


def test_apc_and_bad_arguments(alignment):
    result = jp.coevolution.mutual_information(alignment, shuffles=0)
    mi = result.mi
    off = ~np.eye(len(mi), dtype=bool)
    row = np.where(off, mi, 0).sum(1) / (len(mi) - 1)
    i, j = 2, 5
    assert result.apc[i, j] == pytest.approx(mi[i, j] - row[i] * row[j] / mi[off].mean())
    with pytest.raises(jp.ModelError, match="order must be 2 or 3"):
        jp.coevolution.mutual_information(alignment, order=4)
