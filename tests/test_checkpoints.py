"""Specification: stage checkpoints resume bitwise, move between meshes, restore teachers
without optimizer state, survive interrupted saves, and refuse mismatched trees."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from data_helpers import tiny_config_dict  # noqa: E402  (tests/data is on the path: conftest.py)
from flax.traverse_util import flatten_dict

from loire_jax.config.loader import data_config_from_dict
from loire_jax.config.model import ModelConfig
from loire_jax.model.params import abstract_params
from loire_jax.model.transformer import init_params
from loire_jax.parallel.sharding import make_mesh, param_shardings
from loire_jax.store.checkpoints import (
    CheckpointError,
    DamagedCheckpoint,
    StageCheckpoints,
    restore_params,
    stage_dir,
)
from loire_jax.train.signals import PreemptionGuard
from loire_jax.train.state import TrainState

CFG = ModelConfig(vocab_size=64, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=2)
MESHES = {8: {"data": 2, "fsdp": 2, "tensor": 2}, 4: {"data": 1, "fsdp": 2, "tensor": 2},
          1: {"data": 1, "fsdp": 1, "tensor": 1}}


def tx() -> optax.GradientTransformation:
    # masked AdamW: gates get no optimizer state (MaskedNode leaves in the state)
    mask = {k: k != "gates" for k in abstract_params(CFG)}
    return optax.chain(optax.clip_by_global_norm(1.0), optax.masked(optax.adamw(1e-2), mask))


def make_state(n_devices: int, seed: int = 0) -> TrainState:
    """A trained-looking state on an n-device mesh: non-trivial Adam moments and step."""
    mesh = make_mesh(MESHES[n_devices])
    params = init_params(CFG, jax.random.key(seed), out_shardings=param_shardings(CFG, mesh))
    opt = tx()

    @jax.jit
    def step(p, s):
        grads = jax.tree.map(lambda x: jnp.sin(x * 7.0) + 0.1, p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    state = jax.jit(opt.init)(params)
    params, state = step(params, state)
    params, state = step(params, state)
    return TrainState(params=params, opt_state=state, step=jnp.asarray(2, jnp.int32))


_CACHE: dict = {}


def state8() -> TrainState:
    if "s8" not in _CACHE:
        _CACHE["s8"] = make_state(8)
    return _CACHE["s8"]


def abstract(tree, shardings=None):
    """ShapeDtypeStructs of ``tree``'s leaves, each with its own sharding or ``shardings``'."""
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_on(n_devices: int) -> TrainState:
    """The abstract state on a (possibly different) mesh, as a resuming trainer builds it."""
    mesh = make_mesh(MESHES[n_devices])
    shard = param_shardings(CFG, mesh)
    # optimizer state placed like its params: init under jit on the target mesh
    opt_state = abstract(jax.jit(tx().init)(jax.tree.map(lambda a, s: jnp.zeros(a.shape, a.dtype, device=s),
                                                          abstract_params(CFG), shard)))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return TrainState(params=abstract(abstract_params(CFG), shard), opt_state=opt_state,
                      step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep))


def assert_bitwise(want, got) -> None:
    assert jax.tree.structure(want) == jax.tree.structure(got)
    for (path, w), g in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(got)):
        assert w.dtype == g.dtype and w.shape == g.shape, path
        np.testing.assert_array_equal(np.asarray(w), np.asarray(g), err_msg=str(path))


META = {"model": CFG.to_dict(), "tokenizer": {"kind": "trained_bpe", "vocab_size": 320, "sha": "abc"},
        "data_position": {"domain": 0, "batches": 2}, "note": ["any", 1, 2.5, None, True]}


@pytest.fixture(scope="module")
def saved8(tmp_path_factory):
    """Stage 1 saved at step 2 from an 8-device mesh (async, then waited)."""
    d = stage_dir(tmp_path_factory.mktemp("work"), 1)
    with StageCheckpoints(d, save_every=2) as ck:
        assert ck.save(2, state8(), meta=META)
        ck.wait()
    return d


def test_stage_dir_layout(tmp_path):
    assert stage_dir(tmp_path, 3) == tmp_path / "stage_3"
    with pytest.raises(ValueError):
        stage_dir(tmp_path, 0)


# The tests that read ``saved8`` share one worker, so the module fixture saves once, not once a worker.
SAVED8 = pytest.mark.xdist_group("saved8")


@SAVED8
def test_save_restore_bitwise_on_8_devices(saved8):
    with StageCheckpoints(saved8, save_every=2) as ck:
        assert ck.all_steps() == [2] and ck.latest_step() == 2
        state, meta = ck.restore(abstract_on(8))
    assert_bitwise(state8(), state)
    assert meta == META  # meta JSON round trip
    want = flatten_dict(param_shardings(CFG, make_mesh(MESHES[8])))
    for path, leaf in flatten_dict(state.params).items():
        assert leaf.sharding.is_equivalent_to(want[path], leaf.ndim), path
    # the masked leaves stay MaskedNode: the optimizer state tree is the one optax built
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(state8().opt_state)


@SAVED8
@pytest.mark.parametrize("n", [4, 1])
def test_restore_onto_smaller_mesh(saved8, n):
    with StageCheckpoints(saved8, save_every=2) as ck:
        state, _ = ck.restore(abstract_on(n))
    assert_bitwise(state8(), state)
    for leaf in jax.tree.leaves(state):
        assert len(leaf.sharding.device_set) <= n
    want = flatten_dict(param_shardings(CFG, make_mesh(MESHES[n])))
    for path, leaf in flatten_dict(state.params).items():
        assert leaf.sharding.is_equivalent_to(want[path], leaf.ndim), path


@SAVED8
def test_teacher_restores_params_only(saved8, monkeypatch):
    import orbax.checkpoint as ocp

    read = []
    real = ocp.StandardCheckpointHandler.restore

    def spy(self, directory, *a, **k):
        read.append(Path(directory).name)
        return real(self, directory, *a, **k)

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "restore", spy)
    shard = param_shardings(CFG, make_mesh(MESHES[4]))
    params = restore_params(saved8, abstract(abstract_params(CFG), shard))
    assert read == ["params"]  # the optimizer-state item was never opened
    assert_bitwise(state8().params, params)
    for path, leaf in flatten_dict(params).items():
        assert leaf.sharding.is_equivalent_to(flatten_dict(shard)[path], leaf.ndim), path


@SAVED8
def test_mismatched_tree_is_a_clear_error(saved8):
    bigger = CFG.replace(ffn=64)
    with StageCheckpoints(saved8, save_every=2) as ck:
        wrong = abstract_on(8).replace(params=abstract(abstract_params(bigger)))
        with pytest.raises(CheckpointError, match=r"layers/mlp/up/kernel: shape \(2, 16, 64\) requested, "
                                                  r"\(2, 16, 32\) saved"):
            ck.restore(wrong)
        unclipped = abstract_on(8).replace(opt_state=abstract_on(8).opt_state[1])  # another optimizer's state
        with pytest.raises(CheckpointError, match="missing in checkpoint: opt_state/inner_state/"):
            ck.restore(unclipped)
        wrong_dtype = abstract_on(8).replace(step=jax.ShapeDtypeStruct((), jnp.float32))
        with pytest.raises(CheckpointError, match="step: dtype float32 requested, int32 saved"):
            ck.restore(wrong_dtype)
    with pytest.raises(CheckpointError, match="shape"):
        restore_params(saved8, abstract(abstract_params(bigger)))


@pytest.mark.parametrize("before", [b'"format": ', b'"sha": "ab'])
def test_a_flipped_bit_in_the_meta_is_damage_even_where_the_json_stays_valid(saved8, tmp_path, before):
    """Another format number, another tokenizer hash: the meta's digest tells damage (set
    aside) from a step another loire_jax version wrote (refused) and from a valid meta."""
    d = tmp_path / "stage_1"
    shutil.copytree(saved8, d)
    meta = d / "2" / "meta" / "metadata"
    data = bytearray(meta.read_bytes())
    data[data.index(before) + len(before)] ^= 1
    meta.write_bytes(bytes(data))
    json.loads(data)  # still valid JSON: only the digest can tell
    with StageCheckpoints(d, save_every=2) as ck:
        with pytest.raises(DamagedCheckpoint, match="digest"):
            ck.read_meta()
        step, notes = ck.newest_intact(abstract_on(8))
    assert step is None and len(notes) == 1 and [p.name[:10] for p in d.glob("2.*")] == ["2.damaged-"]


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with StageCheckpoints(tmp_path / "empty", save_every=1) as ck:
        assert ck.latest_step() is None and ck.all_steps() == []
        with pytest.raises(CheckpointError, match="no complete checkpoint"):
            ck.restore(abstract_on(1))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        restore_params(tmp_path / "nothing_here", abstract_params(CFG))


def test_interrupted_and_failed_saves_keep_previous_step(saved8, tmp_path, monkeypatch):
    import shutil

    import orbax.checkpoint as ocp

    d = tmp_path / "stage_1"
    shutil.copytree(saved8, d)
    # A save killed mid-write: Orbax's tmp directory, and a step dir with no commit marker.
    (d / "6.orbax-checkpoint-tmp-1700000000").mkdir()
    (d / "4" / "params").mkdir(parents=True)
    (d / "4" / "params" / "garbage").write_bytes(b"\0" * 16)

    class FullDisk:  # a grain iterator whose state write hits ENOSPC mid-save
        def get_state(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    with StageCheckpoints(d, save_every=2, async_save=True) as ck:
        assert ck.all_steps() == [2] and ck.latest_step() == 2
        with pytest.raises(CheckpointError, match=r"could not write step 8 .*No space left.*previous checkpoint is intact"):
            ck.save(8, state8(), data_iterator=FullDisk(), meta=META, force=True)
            ck.wait()
        assert ck.latest_step() == 2

        # The disk fills during the *background* write of an async save: save() returns,
        # the error comes out of wait(), and the step never appears.
        async def enospc(self, x, directory):
            raise OSError(errno.ENOSPC, "No space left on device (background)")

        with monkeypatch.context() as m:
            m.setattr(ocp.JsonCheckpointHandler, "_save_fn", enospc)
            with pytest.raises(CheckpointError, match="background"):
                ck.save(10, state8(), meta=META, force=True)
                ck.wait()
        assert ck.latest_step() == 2 and not (d / "10").exists()
        state, meta = ck.restore(abstract_on(8))
        assert_bitwise(state8(), state)
        assert meta == META
        # The cut-off step 4 must not block the real step 4 nor count towards keep=2.
        assert ck.save(4, state8(), meta={"step": 4})
        ck.wait()
        assert ck.all_steps() == [2, 4]
    assert [p.name.split(".")[0] for p in d.glob("4.incomplete-*")] == ["4"]  # kept aside, not deleted
    with StageCheckpoints(d, save_every=2) as fresh:  # a restarted job sees the same
        assert fresh.all_steps() == [2, 4]
        assert not list(d.glob("*orbax-checkpoint-tmp*"))  # partial writes removed at restart
        assert fresh.read_meta(2) == META and fresh.read_meta() == {"step": 4}


def test_save_policy_and_keep(tmp_path):
    s = state8()
    with StageCheckpoints(tmp_path / "s", save_every=3, keep=2, async_save=False) as ck:
        saved = [step for step in range(1, 10) if ck.save(step, s, meta={"step": step})]
        assert saved == [3, 6, 9]
        assert ck.save(10, s, meta={"step": 10}, force=True)
        assert ck.all_steps() == [9, 10]
        assert ck.read_meta(9) == {"step": 9}
        state, _ = ck.restore(abstract_on(8), step=9)
        with pytest.raises(TypeError, match="plain JSON"):
            ck.save(12, s, meta={"bad": object()})
    assert_bitwise(s, state)


def test_grain_iterator_state_round_trip(tmp_path):
    from loire_jax.config.stream import StreamSpec
    from loire_jax.data import prepare
    from loire_jax.data.pipeline import train_iterator

    data_cfg = data_config_from_dict(tiny_config_dict(tmp_path / "data"))
    prepare(data_cfg, progress=False)
    kw = dict(seq_len=32, global_batch_size=8, seed=3, replay_ratio=0.25)

    def take(it, n):
        return [np.asarray(next(it)["tokens"]).copy() for _ in range(n)]

    full = take(train_iterator(data_cfg, StreamSpec(2, **kw)), 9)
    it = train_iterator(data_cfg, StreamSpec(2, **kw))
    take(it, 4)
    with StageCheckpoints(tmp_path / "ck", save_every=4) as ck:
        assert ck.save(4, state8(), data_iterator=it, meta=META)
        take(it, 2)  # training goes on after the (async) save started
        ck.wait()
    resumed = train_iterator(data_cfg, StreamSpec(2, **kw))
    with StageCheckpoints(tmp_path / "ck", save_every=4) as ck:
        state, _ = ck.restore(abstract_on(1), data_iterator=resumed)
    assert_bitwise(state8().step, state.step)
    for want, got in zip(full[4:], take(resumed, 5)):
        np.testing.assert_array_equal(want, got)


def test_preemption_guard_sets_flag_and_restores_handler():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard() as guard:
        assert not guard.requested and not guard.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # Python runs handlers between bytecodes of the main thread
            if guard.requested:
                break
        assert guard.requested and guard.should_stop()
    assert signal.getsignal(signal.SIGTERM) is before


def test_async_save_survives_donation_of_the_saved_arrays(tmp_path):
    """The trainer donates its state to the next step right after save() returns."""
    copy = jax.tree.map(lambda x: x.copy(), state8())
    with StageCheckpoints(tmp_path / "s", save_every=1, async_save=True) as ck:
        assert ck.save(1, copy, meta={})
        for leaf in jax.tree.leaves(copy):
            leaf.delete()  # what donate_argnums does to the buffers
        ck.wait()
        state, _ = ck.restore(abstract_on(8))
    assert_bitwise(state8(), state)
