"""The decoder-only Transformer: its hand-written backward, its stage gangs on a real system, its cost."""

from __future__ import annotations

import numpy as np
import pytest

import pathdask as pw
from graphs import transformer as tf
from pathdask import P

TINY = tf.Config(vocab=7, d_model=8, heads=2, d_ff=12, seq=5, layers=2)
CFG = tf.Config()  # the default computed size
KINDS = {"embed", "pos", "ln1", "wq", "wk", "wv", "wo", "ln2", "w1", "b1", "w2", "b2", "lnf", "unembed"}


def max_rel_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-300)) for k in b)


# -- the NumPy reference ------------------------------------------------------------------

def test_finite_differences_check_every_parameter():
    params = tf.init_params(TINY, seed=0)
    tokens, targets = tf.make_batch(TINY, batch=3, seed=1)
    loss, grads = tf.reference_loss_and_grads(params, tokens, targets)
    assert np.isfinite(loss) and sorted(grads) == sorted(params)
    assert {k.rsplit(".", 1)[-1] for k in grads} == KINDS
    flat = tf.pack(params)
    numeric = np.empty_like(flat)
    h = 1e-6
    for i in range(flat.size):
        up, down = flat.copy(), flat.copy()
        up[i] += h
        down[i] -= h
        numeric[i] = (tf.reference_loss_and_grads(tf.unpack(up, TINY), tokens, targets)[0]
                      - tf.reference_loss_and_grads(tf.unpack(down, TINY), tokens, targets)[0]) / (2 * h)
    numeric_by_name = tf.unpack(numeric, TINY)
    for name, g in grads.items():
        assert np.max(np.abs(g)) > 1e-4, f"{name}: a zero gradient checks nothing"
        np.testing.assert_allclose(g, numeric_by_name[name], atol=1e-8, err_msg=name)


def test_reference_forward_is_causal_and_the_loss_is_the_mean_cross_entropy():
    params = tf.init_params(TINY, seed=2)
    tokens, targets = tf.make_batch(TINY, batch=4, seed=3)
    logits = tf.reference_forward(params, tokens)
    assert logits.shape == (4, TINY.seq, TINY.vocab)
    changed = tokens.copy()
    changed[:, -1] = (changed[:, -1] + 1) % TINY.vocab  # only the last position sees the last token
    np.testing.assert_array_equal(tf.reference_forward(params, changed)[:, :-1], logits[:, :-1])
    assert not np.allclose(tf.reference_forward(params, changed)[:, -1], logits[:, -1])
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.mean(np.take_along_axis(logp, targets[..., None], -1))
    assert tf.reference_loss_and_grads(params, tokens, targets)[0] == pytest.approx(expected, rel=1e-12)


def test_reference_sgd_decreases_the_loss():
    params = tf.init_params(CFG, seed=0)
    tokens, targets = tf.make_batch(CFG, batch=8, seed=1)
    losses = []
    for _ in range(5):
        loss, grads = tf.reference_loss_and_grads(params, tokens, targets)
        losses.append(loss)
        params = tf.reference_sgd(params, grads, lr=0.1)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_stages_partition_the_parameters_and_pack_round_trips():
    params = tf.init_params(CFG, seed=0)
    whole = tf.pack(params)
    assert whole.shape == (sum(v.size for v in params.values()),)
    for n in (1, 2, 3, 4):
        stages = [tf.stage_of(CFG, i, n) for i in range(n)]
        assert [s.start for s in stages] == [0, *[s.stop for s in stages[:-1]]] and stages[-1].stop == CFG.layers
        names = [name for s in stages for name, _ in tf.param_shapes(CFG, s)]
        assert sorted(names) == sorted(params)  # every parameter in exactly one stage
        assert sum(tf.pack(params, s).size for s in stages) == whole.size
        assert stages[0].first and stages[-1].last and (n == 1) == stages[0].last
    stage = tf.stage_of(CFG, 1, 3)
    flat = tf.pack(params, stage)
    back = tf.unpack(flat, CFG, stage)
    assert sorted(back) == sorted(name for name, _ in tf.param_shapes(CFG, stage))
    assert "embed" not in back and "unembed" not in back
    for name, v in back.items():
        np.testing.assert_array_equal(v, params[name])
        assert np.shares_memory(v, flat)
    with pytest.raises(ValueError, match="expected"):
        tf.unpack(flat[:-1], CFG, stage)


# -- on a real system -------------------------------------------------------------------------

def test_spmd_step_matches_the_reference(client):
    params = tf.init_params(CFG, seed=0)
    tokens, targets = tf.make_batch(CFG, batch=8, seed=1)
    mesh = client.mesh({"data": 4})
    out = tf.run_step(client, mesh, params, tokens, targets, lr=0.1, steps=2)
    assert out["gangs"] == 4  # forward, loss, backward, sgd
    ref = params
    for k in range(2):
        loss, grads = tf.reference_loss_and_grads(ref, tokens, targets)
        assert out["losses"][k] == pytest.approx(loss, rel=1e-12)
        ref = tf.reference_sgd(ref, grads, lr=0.1)
    assert max_rel_diff(out["params"], ref) < 1e-10
    assert max_rel_diff(out["params"], params) > 1e-3  # the step did move the parameters


def test_stages_run_by_hand_on_several_meshes_match_the_reference_gradients(client):
    """Three stages on meshes of different sizes and islands; activations move between them."""
    params = tf.init_params(CFG, seed=4)
    tokens, targets = tf.make_batch(CFG, batch=8, seed=5)
    meshes = [client.mesh({"data": 2}, island=0), client.mesh({"data": 2}, island=0),
              client.mesh({"data": 4}, island=1)]
    stages = [tf.make_stage(CFG, i, 3) for i in range(3)]
    flats = [client.put(st.pack(params), m, P()) for st, m in zip(stages, meshes)]
    xs = [client.put(tokens, meshes[0], tf.TOKENS)]
    tgt = client.put(targets, meshes[2], tf.TOKENS)
    for st, flat, m in zip(stages, flats, meshes):
        xs.append(st.forward(flat, xs[-1], mesh=m))
    assert xs[1].mesh == meshes[0] and xs[2].mesh == meshes[1] and xs[3].shape == (8, CFG.seq, CFG.vocab)
    np.testing.assert_allclose(xs[3].result(), tf.reference_forward(params, tokens), rtol=1e-12, atol=1e-12)
    assert stages[2].loss is not None and stages[0].loss is None
    loss, dy = stages[2].loss(xs[3], tgt)
    grads = {}
    dxs = []
    for st, flat, x, m in reversed(list(zip(stages, flats, xs[:-1], meshes))):
        dflat, dy = st.backward(flat, x, dy, mesh=m)
        dxs.append(dy)
        grads.update(st.unpack(dflat.result()))
    ref_loss, ref_grads = tf.reference_loss_and_grads(params, tokens, targets)
    assert float(loss.result()) == pytest.approx(ref_loss, rel=1e-12)
    assert max_rel_diff(grads, ref_grads) < 1e-10
    first_dx = dxs[-1]
    assert (first_dx.shape, first_dx.dtype, first_dx.spec) == (tokens.shape, np.float64, tf.TOKENS)
    assert not first_dx.result().any()
    # the helper does the same on two meshes
    loss2, grads2 = tf.run_stages(client, meshes[1:], params, tokens, targets)
    assert loss2 == pytest.approx(ref_loss, rel=1e-12)
    assert max_rel_diff(grads2, ref_grads) < 1e-10
    for a in (*flats, *xs, tgt, loss, dy, *dxs):
        a.delete()


def test_microbatch_gradients_average_to_the_batch_gradient(client):
    """What a pipeline does: the mean of equal microbatches' gradients is the batch's gradient."""
    params = tf.init_params(CFG, seed=6)
    tokens, targets = tf.make_batch(CFG, batch=8, seed=7)
    mesh = client.mesh({"data": 2})
    st = tf.make_stage(CFG)
    flat = client.put(tf.pack(params), mesh, P())
    total = np.zeros(flat.shape)
    held = [flat]
    for rows in (slice(0, 4), slice(4, 8)):
        tok = client.put(tokens[rows], mesh, tf.TOKENS)
        tgt = client.put(targets[rows], mesh, tf.TOKENS)
        assert st.loss is not None
        _, dy = st.loss(st.forward(flat, tok), tgt)
        dflat, _ = st.backward(flat, tok, dy)
        total += dflat.result() / 2
        held += [tok, tgt, dy, dflat]
    _, ref_grads = tf.reference_loss_and_grads(params, tokens, targets)
    assert max_rel_diff(tf.unpack(total, CFG), ref_grads) < 1e-10
    for a in held:
        a.delete()


# -- the modelled cost ---------------------------------------------------------------------------

def test_modelled_sizes_have_their_parameter_counts():
    counts = {name: m.params() for name, m in tf.MODELLED.items()}
    assert 3.0e9 < counts["3B"] < 3.3e9
    assert 6.3e10 < counts["64B"] < 6.6e10
    assert 1.34e11 < counts["136B"] < 1.38e11
    m = tf.MODELLED["3B"]
    assert (m.layers, m.d_model, m.d_ff) == (62, 2048, 8192)  # the Pathways paper's 3B model
    halves = [tf.stage_of(CFG, i, 2) for i in range(2)]
    assert sum(tf.modelled_param_bytes(s) for s in halves) == 2 * counts["3B"]
    assert tf.modelled_activation_bytes(4) == 2 * 4 * 1024 * 2048
    assert tf.modelled_activation_bytes(4, "64B") == 2 * 4 * 1024 * 8192


def test_gang_cost_is_the_modelled_flops_over_device_flops(client):
    mesh = client.mesh({"data": 2})
    flops = client.topology.device_flops
    first, last = tf.make_stage(CFG, 0, 2, "3B"), tf.make_stage(CFG, 1, 2, "3B")
    assert last.loss is not None
    loss_fn = last.loss

    @pw.program
    def step(p0, p1, tokens, targets):
        h = first.forward(p0, tokens)
        _, dlogits = loss_fn(last.forward(p1, h), targets)
        d1, dx = last.backward(p1, h, dlogits)
        d0, _ = first.backward(p0, tokens, dx)
        return last.sgd(p1, d1), first.sgd(p0, d0)

    params = tf.init_params(CFG)
    seconds = {}
    for batch in (8, 16):
        tokens, targets = tf.make_batch(CFG, batch)
        arrays = [client.put(first.pack(params), mesh, P()), client.put(last.pack(params), mesh, P()),
                  client.put(tokens, mesh, tf.TOKENS), client.put(targets, mesh, tf.TOKENS)]
        gangs = step.trace(*arrays).gangs
        seconds[batch] = {g.name: g.cost_s for g in gangs}
        for a in arrays:
            a.delete()
    # 3B, seq 1024: the last of two stages holds 31 of 62 layers and the unembedding
    per_layer = 4 * 2048**2 + 2 * 2048 * 8192
    attention = 4 * 1024**2 * 2048
    examples = 8 // 2  # rows per device
    fwd_last = examples * (2 * 1024 * (31 * per_layer + 2048 * 32000) + 31 * attention)
    fwd_first = examples * (2 * 1024 * 31 * per_layer + 31 * attention)
    got = seconds[8]
    assert got["forward1"] == pytest.approx(fwd_last / flops, rel=1e-12)
    assert got["forward0"] == pytest.approx(fwd_first / flops, rel=1e-12)
    assert got["backward1"] == pytest.approx(2 * fwd_last / flops, rel=1e-12)
    assert got["backward0"] == pytest.approx(2 * fwd_first / flops, rel=1e-12)
    assert got["loss"] == pytest.approx(examples * 1024 * 32000 * 5 / flops, rel=1e-12)
    assert got["sgd0"] == pytest.approx(2 * (31 * (per_layer + 8192 + 3 * 2048) + 32000 * 2048 + 1024 * 2048)
                                        / flops, rel=1e-12)
    assert got["forward1"] > 1e-3  # paper size: milliseconds per gang, not the tiny computed model's
    for name, s in seconds[16].items():  # twice the examples per device, twice the time; SGD is per step
        assert s == pytest.approx(got[name] * (1 if name.startswith("sgd") else 2), rel=1e-12), name
