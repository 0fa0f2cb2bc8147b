"""Offline tests of the data subsystem on the small fixtures under tests/data/fixtures."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from data_helpers import local_domain, tiny_config_dict

from loire_jax.config.loader import data_config_from_dict, load_data_config
from loire_jax.config.stream import StreamSpec
from loire_jax.data import (
    ConfigError,
    DataError,
    InsufficientDataError,
    SourceError,
    TokenizerMismatchError,
    check_compatible,
    eval_iterator,
    format_table,
    load_prepared,
    load_tokenizer,
    prepare,
    storage,
    to_global_batch,
    train_dataset,
    train_iterator,
)
from loire_jax.data.packing import PackedWindows
from loire_jax.data.prepare import domain_config_name
from loire_jax.data.splits import assign_splits

SEQ, BATCH = 32, 8


def _take(it, n):
    return [next(it)["tokens"].copy() for _ in range(n)]


# --- config ------------------------------------------------------------------------------

def test_config_validation_errors(tmp_path):
    good = tiny_config_dict(tmp_path)
    data_config_from_dict(good)
    for bad in (
        {**good, "domains": []},
        {**good, "recovery_fraction": 1.5},
        {**good, "typo_field": 1},
        {**good, "tokenizer": {"kind": "word2vec"}},
        {**good, "tokenizer": {"kind": "sentencepiece"}},  # needs a path
        {**good, "domains": [local_domain("A", "science.txt"), local_domain("A", "news.jsonl")]},
        {**good, "domains": [{"name": "X", "source": {"kind": "builtin", "corpus": "poetry"}}]},
    ):
        with pytest.raises(ConfigError):
            data_config_from_dict(bad)


def test_config_errors_are_one_line_naming_the_key_and_the_valid_ones(tmp_path):
    good = tiny_config_dict(tmp_path)
    (tmp_path / "broken.yaml").write_text("domains: [\n  - {name: A\n")
    bad_source = {**good, "domains": [{"name": "A", "source": {"kind": "local", "paths": ["a"], "fromat": "text"}}]}
    for load, needle in (
        (lambda: data_config_from_dict({**good, "typo_field": 1}),
         "unknown key 'typo_field' in the data config; valid keys are ['cache_dir', 'data_dir', 'domains', "
         "'max_doc_chars', 'min_doc_chars', 'recovery_fraction', 'split_seed', 'tokenizer', 'validation_docs']"),
        (lambda: data_config_from_dict(bad_source), "unknown key 'fromat' in domains.0.source; valid keys are ["),
        (lambda: data_config_from_dict({**good, "validation_docs": "ten"}),
         "validation_docs: Input should be a valid integer"),
        (lambda: load_data_config(tmp_path / "broken.yaml"), "is not valid YAML"),
    ):
        with pytest.raises(ConfigError) as err:
            load()
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_config_yaml_resolves_paths_relative_to_file(tmp_path):
    (tmp_path / "cfg.yaml").write_text(
        "data_dir: %s\ndomains:\n  - {name: A, source: {kind: local, paths: [fix/a.txt]}}\n"
        % tmp_path)
    cfg = load_data_config(tmp_path / "cfg.yaml")
    assert cfg.domains[0].source.paths == (str(tmp_path / "fix" / "a.txt"),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.split_seed = 3  # type: ignore[misc]


def test_shipped_yaml_configs_parse():
    root = Path(__file__).resolve().parents[2] / "configs" / "domains"
    default = load_data_config(root / "default.yaml")
    assert [d.name for d in default.domains] == ["WB", "NEWS", "REV", "BIO", "CS"]
    paper = load_data_config(root / "tfds_paper.yaml")
    assert {d.source.kind for d in paper.domains} == {"tfds"}


# --- splits ------------------------------------------------------------------------------

def test_splits_are_deterministic_disjoint_and_sized():
    a = assign_splits(1000, domain="WB", validation_docs=50, recovery_fraction=0.1, seed=7)
    b = assign_splits(1000, domain="WB", validation_docs=50, recovery_fraction=0.1, seed=7)
    c = assign_splits(1000, domain="WB", validation_docs=50, recovery_fraction=0.1, seed=8)
    for s in a:
        np.testing.assert_array_equal(a[s], b[s])
    assert not np.array_equal(a["validation"], c["validation"])
    allidx = np.concatenate([a["pretrain"], a["memory"], a["validation"]])
    assert sorted(allidx.tolist()) == list(range(1000))
    assert len(a["validation"]) == 50 and len(a["memory"]) == 95 and len(a["pretrain"]) == 855


# --- prepare, cache, corruption ------------------------------------------------------------

def test_prepare_summary_and_table(tiny_cfg):
    summary = json.loads((Path(tiny_cfg.data_dir) / "summary.json").read_text())
    assert [d["name"] for d in summary["domains"]] == ["SCI", "NEWS", "REV"]
    for d in summary["domains"]:
        sp = d["splits"]
        assert sp["validation"]["documents"] == 10
        assert sp["pretrain"]["documents"] + sp["memory"]["documents"] + 10 == 120
        assert all(v["tokens"] > v["documents"] for v in sp.values())
    table = format_table(summary)
    assert "SCI" in table and "total" in table and "pretrain tokens" in table


def test_prepare_is_idempotent_and_reuses_cache(tiny_cfg):
    tdir = storage.dataset_dir(Path(tiny_cfg.data_dir) / "tfds",
                               domain_config_name(tiny_cfg, tiny_cfg.domains[0]))
    before = {p: p.stat().st_mtime_ns for p in tdir.iterdir()}
    s1 = prepare(tiny_cfg, progress=False)
    assert {p: p.stat().st_mtime_ns for p in tdir.iterdir()} == before
    assert s1 == json.loads((Path(tiny_cfg.data_dir) / "summary.json").read_text())


def test_corrupt_or_partial_cache_is_rebuilt(tmp_path):
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[
        local_domain("SCI", "science.txt"), local_domain("REV", "reviews.txt")]))
    ref = prepare(cfg, progress=False)
    root = Path(cfg.data_dir)
    ddir = storage.dataset_dir(root / "tfds", domain_config_name(cfg, cfg.domains[0]))
    # 1) a truncated ArrayRecord file
    shard = next(ddir.glob("*pretrain.array_record*"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert storage.is_complete(root / "tfds", ddir.parent.name) is None
    assert prepare(cfg, progress=False) == ref
    # 2) an interrupted build: data written, completion marker never written
    (ddir / storage.MARKER).unlink()
    assert prepare(cfg, progress=False) == ref
    assert (ddir / storage.MARKER).is_file()
    # 3) a corrupted token file of the same size (caught by the checksum)
    tok_file = next((root / "tokens").rglob("validation.bin"))
    data = bytearray(tok_file.read_bytes())
    data[0] ^= 0xFF
    tok_file.write_bytes(bytes(data))
    assert prepare(cfg, progress=False) == ref
    assert bytes(data) != tok_file.read_bytes()
    # 4) leftovers of an interrupted tokenization are ignored
    (root / "tokens" / ".tok-leftover").mkdir()
    assert prepare(cfg, progress=False) == ref


# --- tokenizer ---------------------------------------------------------------------------

def test_trained_tokenizer_identity_and_mismatch(tiny_cfg, tmp_path):
    tok = load_tokenizer(tiny_cfg)
    assert tok.identity["kind"] == "trained_bpe"
    assert tok.identity["vocab_size"] == tok.vocab_size == 320
    ids = tok.encode("The river carries fine silt.")
    assert ids and all(0 <= i < tok.vocab_size for i in ids) and tok.eos_id not in ids
    json.dumps(tok.identity)  # JSON-able for checkpoints
    assert load_tokenizer(tiny_cfg).identity == tok.identity  # reused, not retrained
    check_compatible(tok.identity, dict(tok.identity))
    other = {**tok.identity, "sha256": "0" * 64}
    with pytest.raises(TokenizerMismatchError, match="tokenizer mismatch"):
        check_compatible(other, tok.identity)


def test_local_sentencepiece_tokenizer(tiny_cfg, tmp_path):
    model = next((Path(tiny_cfg.data_dir) / "tokenizers").rglob("spm.model"))
    cfg = data_config_from_dict(tiny_config_dict(
        tmp_path, tokenizer={"kind": "sentencepiece", "path": str(model)}))
    tok = load_tokenizer(cfg)
    assert tok.identity["kind"] == "sentencepiece"
    assert tok.encode("bees dance") == load_tokenizer(tiny_cfg).encode("bees dance")


# --- training iterator --------------------------------------------------------------------

def test_train_batches_shape_dtype_and_packing(tiny_cfg):
    it = train_iterator(tiny_cfg, StreamSpec(0, seq_len=SEQ, global_batch_size=BATCH, seed=0, replay_ratio=0.0))
    b = next(it)
    assert set(b) == {"tokens"}
    assert b["tokens"].shape == (BATCH, SEQ + 1) and b["tokens"].dtype == np.int32
    eos = load_tokenizer(tiny_cfg).eos_id
    prep = load_prepared(tiny_cfg)
    stream = np.asarray(prep.tokens(0, "pretrain"))
    # one EOS after every document; windows continue into the next document after an EOS
    assert (stream == eos).sum() == prep.token_meta[0]["pretrain"]["documents"]
    rows = np.concatenate([next(it)["tokens"] for _ in range(10)])
    assert (rows[:, :-1] == eos).any()


def test_packing_short_documents_unit():
    eos = 0
    docs = [[1, 2], [3], [4, 5, 6], [7], [8, 9]]  # every document shorter than seq_len
    stream = np.array([t for d in docs for t in d + [eos]], np.int32)
    w = PackedWindows([stream], seq_len=4)
    assert len(w) == (len(stream) - 1) // 4
    for i in range(len(w)):
        np.testing.assert_array_equal(w[i], stream[4 * i:4 * i + 5])  # overlap by one token
        assert w[i].dtype == np.int32 and w[i].shape == (5,)
    assert (w[0] == eos).sum() == 2  # several documents in one sequence
    multi = PackedWindows([stream[:7], stream[7:]], seq_len=3)  # windows never cross streams
    assert len(w) == 3 and len(multi) == 2 + 2 and list(multi[2]) == list(stream[7:11])
    with pytest.raises(IndexError):
        w[len(w)]


def test_train_iterator_deterministic_and_seeded(tiny_cfg):
    kw = dict(seq_len=SEQ, global_batch_size=BATCH, replay_ratio=0.1)
    a = _take(train_iterator(tiny_cfg, StreamSpec(2, seed=3, **kw)), 6)
    b = _take(train_iterator(tiny_cfg, StreamSpec(2, seed=3, **kw)), 6)
    c = _take(train_iterator(tiny_cfg, StreamSpec(2, seed=4, **kw)), 6)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def test_epochs_are_reshuffled_and_cover_every_window(tiny_cfg):
    prep = load_prepared(tiny_cfg)
    n = len(PackedWindows([prep.tokens(0, "pretrain")], SEQ))
    ds = train_dataset(tiny_cfg, StreamSpec(0, seq_len=SEQ, global_batch_size=1, seed=0, replay_ratio=0.0))
    first = [tuple(ds[i]["tokens"][0]) for i in range(n)]
    second = [tuple(ds[n + i]["tokens"][0]) for i in range(n)]
    from collections import Counter
    assert len(first) == n and Counter(first) == Counter(second) and first != second


def test_resume_continues_exact_sequence(tiny_cfg):
    kw = dict(seq_len=SEQ, global_batch_size=BATCH, seed=11, replay_ratio=0.25)
    full = _take(train_iterator(tiny_cfg, StreamSpec(2, **kw)), 12)
    it = train_iterator(tiny_cfg, StreamSpec(2, **kw))
    _take(it, 5)
    state = json.loads(json.dumps(it.get_state()))  # survives serialisation
    fresh = train_iterator(tiny_cfg, StreamSpec(2, **kw))
    t0 = time.perf_counter()
    fresh.set_state(state)
    assert time.perf_counter() - t0 < 1.0  # O(1): no replay of earlier batches
    for want, got in zip(full[5:], _take(fresh, 7)):
        np.testing.assert_array_equal(want, got)


def test_resume_through_orbax_grain_checkpoint(tiny_cfg, tmp_path):
    import grain
    import orbax.checkpoint as ocp

    kw = dict(seq_len=SEQ, global_batch_size=BATCH, seed=5, replay_ratio=0.1)
    full = _take(train_iterator(tiny_cfg, StreamSpec(1, **kw)), 8)
    it = train_iterator(tiny_cfg, StreamSpec(1, **kw))
    _take(it, 3)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    resumed = train_iterator(tiny_cfg, StreamSpec(1, **kw))
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(resumed)))
    for want, got in zip(full[3:], _take(resumed, 5)):
        np.testing.assert_array_equal(want, got)


def _window_sets(cfg, k):
    prep = load_prepared(cfg)
    cur = PackedWindows([prep.tokens(k, "pretrain")], SEQ)
    mem = PackedWindows([prep.tokens(j, "memory") for j in range(k)], SEQ)
    as_set = lambda src: {tuple(src[i]) for i in range(len(src))}  # noqa: E731
    return as_set(cur), as_set(mem)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5])
def test_replay_mixture_ratio(tiny_cfg, ratio):
    cur, mem = _window_sets(tiny_cfg, 2)
    ds = train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=ratio))
    rows = [tuple(r) for i in range(40) for r in ds[i]["tokens"]]
    from_mem = sum(r in mem and r not in cur for r in rows)
    from_cur = sum(r in cur for r in rows)
    assert from_mem + from_cur == len(rows)  # every row is from one of the two sources
    assert abs(from_mem / len(rows) - ratio) <= 0.02


def test_no_window_repeats_at_the_replay_to_train_hand_over(tiny_cfg):
    """A stage is one stream: the train steps continue the domain where the replay steps
    left it. Counted over the hand-over, no current-domain window repeats within an epoch,
    and the replay steps hold the ratio in every batch to within one window."""
    cur, mem = _window_sets(tiny_cfg, 2)
    bs, replay_steps, ratio = 10, 6, 0.1
    ds = train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=bs, seed=3, replay_ratio=ratio,
                                            replay_end=replay_steps, steps=100))
    assert len(ds) == 100
    batches = [[tuple(r) for r in ds[i]["tokens"]] for i in range(len(ds))]
    replay_rows = [r for b in batches[:replay_steps] for r in b]
    train_rows = [r for b in batches[replay_steps:] for r in b]
    for b in batches[:replay_steps]:
        assert abs(sum(r in mem and r not in cur for r in b) - ratio * bs) <= 1
    assert sum(r in mem and r not in cur for r in replay_rows) == round(ratio * len(replay_rows))
    assert all(r in cur for r in train_rows)  # no replay after the replay steps
    current = [r for r in replay_rows if r in cur] + train_rows
    src = PackedWindows([load_prepared(tiny_cfg).tokens(2, "pretrain")], SEQ)
    in_domain = Counter(tuple(src[i]) for i in range(len(src)))  # the text itself has a few equal windows
    first_epoch = Counter(current[:len(src)])
    repeats = sum(max(0, n - in_domain[r]) for r, n in first_epoch.items())
    assert repeats == 0, f"{repeats} windows repeated across the hand-over within one epoch of {len(src)}"
    assert len(current) > len(src) > replay_steps * bs  # the check spans the hand-over and a whole epoch
    assert first_epoch == in_domain  # ... which serves every window once


def test_elles_recovering_warmup_reads_the_memory_alone_then_the_stream_goes_on(tiny_cfg):
    """ELLE's recovering warmup: the first recover steps are memory windows only, in the
    memory's own order; then the replay share holds, and the domain starts at its first
    window (nothing of it was skipped while the memory alone was read)."""
    cur, mem = _window_sets(tiny_cfg, 2)
    bs, recover, ratio = 10, 3, 0.1
    kw = dict(seq_len=SEQ, global_batch_size=bs, seed=3, replay_ratio=ratio, replay_end=20, steps=20)
    ds = train_dataset(tiny_cfg, StreamSpec(2, recover_steps=recover, **kw))
    plain = train_dataset(tiny_cfg, StreamSpec(2, **kw))
    batches = [[tuple(r) for r in ds[i]["tokens"]] for i in range(len(ds))]
    assert all(r in mem and r not in cur for b in batches[:recover] for r in b)
    for b in batches[recover:]:
        assert abs(sum(r in mem and r not in cur for r in b) - ratio * bs) <= 1
    # after them the domain's windows are the plain stream's, from its first one on
    after = [r for b in batches[recover:] for r in b if r in cur]
    assert after == [r for i in range(len(ds) - recover) for r in map(tuple, plain[i]["tokens"]) if r in cur]
    # and the replay goes on through the memory where the recovering steps left it
    memory_only = train_dataset(tiny_cfg, StreamSpec(2, recover_steps=20, **kw))
    replayed = [r for b in batches for r in b if r not in cur]
    assert replayed == [tuple(r) for i in range(20) for r in memory_only[i]["tokens"]][:len(replayed)]


@pytest.mark.parametrize("own", [False, True], ids=["pretrain-beside", "own-memory-beside"])
def test_a_replay_window_at_the_stage_end_keeps_the_share_and_the_domain_order(tiny_cfg, own):
    """recovery: end: the replay window is the stage's last steps. Before it, the domain's
    windows alone, as a stream without replay serves them; inside it the replay share of the
    earlier domains' memory, the rest from the domain's own memory (``own``) or its
    pre-training windows, continuing where they stopped; the old-memory count is the plan's."""
    from loire_jax.config.schedule import replay_fraction

    prep = load_prepared(tiny_cfg)
    cur, mem = _window_sets(tiny_cfg, 2)
    own_set = {tuple(w) for w in PackedWindows([prep.tokens(2, "memory")], SEQ)}
    bs, start, end, ratio = 10, 12, 20, 0.2
    kw = dict(seq_len=SEQ, global_batch_size=bs, seed=3, steps=end)
    ds = train_dataset(tiny_cfg, StreamSpec(2, replay_ratio=ratio, replay_end=end, replay_start=start,
                                            own_memory=own, **kw))
    plain = train_dataset(tiny_cfg, StreamSpec(2, replay_ratio=0.0, **kw))
    batches = [[tuple(r) for r in ds[i]["tokens"]] for i in range(end)]
    assert batches[:start] == [[tuple(r) for r in plain[i]["tokens"]] for i in range(start)]
    window = [r for b in batches[start:] for r in b]
    old = [r for r in window if r in mem and r not in cur and r not in own_set]
    frac = replay_fraction(ratio)
    assert len(old) == (end - start) * bs * frac.numerator // frac.denominator
    rest = [r for r in window if r not in old]
    if own:
        assert all(r in own_set for r in rest)
    else:  # the domain goes on where it stopped: the plain stream's next windows
        assert rest == [tuple(r) for i in range(start, end) for r in plain[i]["tokens"]][:len(rest)]


def test_weighted_replay_shares_the_memory_windows_by_the_weights(tiny_cfg):
    """ELLE's forgetting-weighted replay: each memory domain's share of the replayed windows
    follows its weight (here 3:1), whatever the sizes of the memories."""
    prep = load_prepared(tiny_cfg)
    sets = [{tuple(w) for w in PackedWindows([prep.tokens(j, "memory")], SEQ)} for j in (0, 1)]
    cur, _ = _window_sets(tiny_cfg, 2)
    ds = train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=0.5,
                                            memory_weights=(3.0, 1.0)))
    rows = [tuple(r) for i in range(80) for r in ds[i]["tokens"] if tuple(r) not in cur]
    counts = [sum(r in sets[j] and r not in sets[1 - j] for r in rows) for j in (0, 1)]
    assert sum(counts) >= 0.95 * len(rows) > 300
    assert counts[0] / sum(counts) == pytest.approx(0.75, abs=0.03)
    with pytest.raises(ConfigError, match="one positive weight per memory domain"):
        train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=0.5,
                                           memory_weights=(1.0,)))


@pytest.mark.parametrize("at", [0, 1])
def test_domain_prompts_head_every_window_of_their_domain_memory_and_validation_included(tiny_cfg, at):
    """ELLE's prompts: the stage's windows carry its domain's prompt at ``at`` (1: after an
    encoder's [CLS]), each replayed window its own domain's, and evaluation the evaluated
    domain's; the rest of every window is the window without prompts."""
    prompts = {0: 500, 1: 501, 2: 502}
    prep = load_prepared(tiny_cfg)
    memory = [{tuple(np.delete(w, at)) for w in PackedWindows([prep.tokens(j, "memory")], SEQ)} for j in (0, 1)]
    kw = dict(seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=0.5)
    plain, ds = train_dataset(tiny_cfg, StreamSpec(2, **kw)), train_dataset(tiny_cfg, StreamSpec(2,
                                                   prompts=prompts, prompt_at=at, **kw))
    seen = Counter()
    for i in range(12):
        for row, bare in zip(ds[i]["tokens"], plain[i]["tokens"]):
            rest = tuple(np.delete(row, at))
            owner = 2 if rest == tuple(np.delete(bare, at)) and row[at] == 502 else \
                next((j for j in (0, 1) if rest in memory[j] and row[at] == prompts[j]), None)
            assert owner is not None, (row[at], i)
            seen[owner] += 1
    assert seen[2] and seen[0] and seen[1]  # the domain and both memories, each with its own prompt
    it = eval_iterator(tiny_cfg, 1, seq_len=SEQ, batch_size=4, prompt=501, prompt_at=at)
    bare = eval_iterator(tiny_cfg, 1, seq_len=SEQ, batch_size=4)
    for batch, reference in zip(it, bare):
        rows = batch["weights"].sum(1) > 0
        assert (batch["tokens"][rows, at] == 501).all()
        np.testing.assert_array_equal(np.delete(batch["tokens"], at, 1), np.delete(reference["tokens"], at, 1))
        np.testing.assert_array_equal(batch["weights"], reference["weights"])


def test_recovering_needs_an_earlier_domains_memory(tiny_cfg):
    with pytest.raises(ConfigError, match="recover_steps=2 needs the recovery memory"):
        train_dataset(tiny_cfg, StreamSpec(0, seq_len=SEQ, global_batch_size=8, seed=0, replay_ratio=0.0,
                                           recover_steps=2))


def test_first_domain_has_no_memory_to_replay(tiny_cfg):
    cur, _ = _window_sets(tiny_cfg, 0)
    ds = train_dataset(tiny_cfg, StreamSpec(0, seq_len=SEQ, global_batch_size=8, seed=0, replay_ratio=0.1))
    assert all(tuple(r) in cur for i in range(5) for r in ds[i]["tokens"])


def test_process_shards_partition_the_global_batch(tiny_cfg):
    kw = dict(seq_len=SEQ, global_batch_size=8, seed=0, replay_ratio=0.1)
    whole = train_dataset(tiny_cfg, StreamSpec(1, **kw))[0]["tokens"]
    p0 = train_dataset(tiny_cfg, StreamSpec(1, **kw), process_index=0, process_count=2)[0]["tokens"]
    p1 = train_dataset(tiny_cfg, StreamSpec(1, **kw), process_index=1, process_count=2)[0]["tokens"]
    assert p0.shape == (4, SEQ + 1)
    np.testing.assert_array_equal(np.stack([p0, p1], 1).reshape(8, -1), whole)


def test_global_batch_on_8_device_mesh(tiny_cfg):
    import jax
    from jax.sharding import Mesh, PartitionSpec

    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    it = train_iterator(tiny_cfg, StreamSpec(1, seq_len=SEQ, global_batch_size=8, seed=0, replay_ratio=0.1))
    b = to_global_batch(next(it), mesh)["tokens"]
    assert isinstance(b, jax.Array) and b.shape == (8, SEQ + 1) and b.dtype == np.int32
    assert b.sharding.spec == PartitionSpec(("data", "fsdp"))
    assert len({str(s.index) for s in b.addressable_shards}) == 4  # rows split 4 ways
    want = train_dataset(tiny_cfg, StreamSpec(1, seq_len=SEQ, global_batch_size=8, seed=0,
                                              replay_ratio=0.1))[0]["tokens"]
    np.testing.assert_array_equal(np.asarray(b), want)
    arr = to_global_batch(np.arange(8 * 3, dtype=np.int32).reshape(8, 3), mesh, ("data",))
    assert arr.sharding.spec == PartitionSpec(("data",))
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        to_global_batch(np.zeros((6, 3), np.int32), mesh)


# --- evaluation iterator ------------------------------------------------------------------

def test_eval_iterator_covers_validation_exactly_once(tiny_cfg):
    prep = load_prepared(tiny_cfg)
    stream = np.asarray(prep.tokens(1, "validation"))
    batches = list(eval_iterator(tiny_cfg, 1, seq_len=SEQ, batch_size=3))
    again = list(eval_iterator(tiny_cfg, 1, seq_len=SEQ, batch_size=3))
    assert all(b["tokens"].shape == (3, SEQ + 1) and b["weights"].shape == (3, SEQ)
               for b in batches)
    total = sum(float(b["weights"].sum()) for b in batches)
    assert total == len(stream) - 1  # every target token counted once
    # rebuild the target stream from the weighted targets: identical, in order
    targets = np.concatenate([b["tokens"][:, 1:][b["weights"] > 0] for b in batches])
    np.testing.assert_array_equal(targets, stream[1:])
    for x, y in zip(batches, again):
        np.testing.assert_array_equal(x["tokens"], y["tokens"])
    assert batches[-1]["weights"].sum() < 3 * SEQ  # the explicit partial final batch


# --- bad input ----------------------------------------------------------------------------

def _prep_one(tmp_path, domain, **kw):
    cfg = data_config_from_dict(tiny_config_dict(
        tmp_path, domains=[local_domain("SCI", "science.txt"), domain], **kw))
    return prepare(cfg, progress=False), cfg


def test_missing_local_file(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        _prep_one(tmp_path, local_domain("X", "does_not_exist.txt"))


def test_empty_domain(tmp_path):
    with pytest.raises(SourceError, match="empty"):
        _prep_one(tmp_path, local_domain("X", "empty.txt"))


def test_undecodable_bytes(tmp_path):
    with pytest.raises(SourceError, match="not valid UTF-8"):
        _prep_one(tmp_path, local_domain("X", "bad_utf8.txt"), validation_docs=1,
                  min_doc_chars=5)
    summary, _ = _prep_one(tmp_path, local_domain("X", "bad_utf8.txt", encoding_errors="replace"),
                           validation_docs=1, min_doc_chars=5, recovery_fraction=0.5)
    assert sum(v["documents"] for v in summary["domains"][1]["splits"].values()) == 3


def test_too_few_documents_for_splits(tmp_path):
    with pytest.raises(InsufficientDataError, match="validation_docs"):
        _prep_one(tmp_path, local_domain("X", "tiny.txt"))


def test_domain_smaller_than_one_batch(tmp_path):
    _, cfg = _prep_one(tmp_path, local_domain("X", "tiny.txt"), validation_docs=2)
    with pytest.raises(InsufficientDataError, match="fewer than one global batch"):
        train_iterator(cfg, StreamSpec(1, seq_len=64, global_batch_size=16, seed=0, replay_ratio=0.0))


def test_missing_tfds_dataset_says_what_to_do(tmp_path):
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[{"name": "BIO", "source": {
        "kind": "tfds", "name": "scientific_papers", "config": "pubmed",
        "tfds_data_dir": str(tmp_path / "nothing_here"), "text_field": "abstract"}}]))
    with pytest.raises(SourceError, match="tfds build scientific_papers/pubmed"):
        prepare(cfg, progress=False)


def test_tfds_source_reads_a_prepared_dataset(tiny_cfg, tmp_path):
    # Our own ArrayRecord output is a real TFDS dataset: read it back as a "tfds" source.
    src_cfg = domain_config_name(tiny_cfg, tiny_cfg.domains[0])
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, validation_docs=5, domains=[{
        "name": "T", "source": {"kind": "tfds", "name": "loire_text", "config": src_cfg,
                                "split": "pretrain", "tfds_data_dir": str(Path(tiny_cfg.data_dir) / "tfds")}}]))
    summary = prepare(cfg, progress=False)
    src_docs = json.loads((Path(tiny_cfg.data_dir) / "summary.json").read_text())
    n = src_docs["domains"][0]["splits"]["pretrain"]["documents"]
    assert sum(v["documents"] for v in summary["domains"][0]["splits"].values()) == n


def test_replay_draws_only_on_the_memory_domains_asked_for(tiny_cfg):
    """ER replays the previous domain only: with memory_domains=[1], every replayed row is a
    window of domain 1's memory, and domain 0's memory never appears."""
    prep = load_prepared(tiny_cfg)
    cur, _ = _window_sets(tiny_cfg, 2)
    only = {tuple(r) for r in PackedWindows([prep.tokens(1, "memory")], SEQ)}
    other = {tuple(r) for r in PackedWindows([prep.tokens(0, "memory")], SEQ)} - only - cur
    ds = train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=0.5,
                                            memory_domains=[1]))
    rows = [tuple(r) for i in range(20) for r in ds[i]["tokens"]]
    replayed = [r for r in rows if r not in cur]
    assert len(replayed) >= 90 and all(r in only for r in replayed)
    assert not any(r in other for r in rows)
    with pytest.raises(ConfigError, match="memory_domains"):
        train_dataset(tiny_cfg, StreamSpec(2, seq_len=SEQ, global_batch_size=10, seed=0, replay_ratio=0.5,
                                           memory_domains=[7]))


def test_a_cache_only_tokenizer_lookup_never_builds(tiny_cfg, tmp_path):
    """load_tokenizer(build=False) (what an export uses) returns the cached tokenizer, and on
    a data directory without it raises DataError having fetched, trained and written nothing."""
    cached = load_tokenizer(tiny_cfg, build=False)
    assert cached.identity == load_tokenizer(tiny_cfg).identity
    empty = dataclasses.replace(tiny_cfg, data_dir=str(tmp_path / "none"))
    for kind in ("trained_bpe", "gpt2"):
        cfg = dataclasses.replace(empty, tokenizer=dataclasses.replace(empty.tokenizer, kind=kind))
        with pytest.raises(DataError, match="not in the data cache"):
            load_tokenizer(cfg, build=False)
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").rglob("*"))
