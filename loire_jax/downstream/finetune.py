"""Fine-tuning a finished stage's model on a downstream task (the paper's Tables 5, 6, 7, 11).

``finetune(run_dir, task, cfg)`` reads the stage's final checkpoint (the parameters only),
puts a fresh head on it (``heads``), and trains both with AdamW on the task's training split
for ``epochs`` epochs, scoring the validation split after each. It uses the run's device
mesh and partition rules (the backbone sharded as in pre-training, the head replicated, the
batch split over the data axes) and the run's compute dtype, so a model that was trained
sharded is fine-tuned sharded and never gathered onto one host.

Each seed is its own job in ``<run_dir>/finetune/<task>/stage<k>/seed<s>/``: checkpoints
(Orbax, atomic, checked), ``metrics.jsonl`` and, once done, ``results.json``. A job killed
at any point resumes from its newest checkpoint and reproduces the uninterrupted job bit
for bit: the batch order is a function of (seed, epoch), the head's initialisation of the
seed, and the history of losses and scores travels in the checkpoint. SIGTERM saves and
stops (exit 75 from the CLI); a finished job is skipped, not redone, while the checkpoint,
data and settings it records still hold (``provenance``, which also holds the job's lock).

The stage's own run directory is only read, never changed, apart from ``finetune/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax import paths
from loire_jax.analysis.downstream import FINETUNE_DIR, RESULTS  # the layout the reports read
from loire_jax.config.finetune import FinetuneConfig, TaskConfig
from loire_jax.config.shapes import GATES
from loire_jax.downstream import baselines, encoding, heads, provenance, scoring
from loire_jax.downstream.errors import FinetuneError
from loire_jax.downstream.programs import Programs, data_ways, finetune_optimizer, host
from loire_jax.downstream.progress import JobProgress, bar_wanted
from loire_jax.downstream.settings import fit_max_len, given
from loire_jax.downstream.stage_model import StageModel, stage_model  # noqa: F401  (public here too)
from loire_jax.downstream.tasks import TaskError, load_examples
from loire_jax.parallel import peers
from loire_jax.paths import Path

METRICS = "metrics.jsonl"


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed's outcome: the validation score after the last epoch (``score``, in the task's
    metric, percent), every epoch's scores, and where it all is."""

    seed: int
    score: float
    metric: str
    epochs: list[dict[str, Any]]
    directory: Path
    skipped: bool = False  # already done by an earlier call: read back, not retrained


@dataclasses.dataclass(frozen=True)
class FinetuneResult:
    task: str
    stage: int
    metric: str
    seeds: list[SeedResult]
    stopped: int | None = None  # the signal that stopped the job early (resume by rerunning), else None
    baseline: dict[str, Any] | None = None  # the task's trivial baseline on the examples scored (``baselines``)

    @property
    def complete(self) -> bool:
        return self.stopped is None

    @property
    def mean_half_range(self) -> tuple[float, float]:
        return scoring.mean_half_range([s.score for s in self.seeds])


def _layout(sm: StageModel) -> encoding.Layout:
    if sm.model.encoder:
        from loire_jax.data.special import special_tokens

        sp = special_tokens(sm.tokenizer, sm.model.vocab_size)
        return encoding.Layout(encoder=True, sep=sp.sep, pad=sp.pad, cls=sp.cls, type_rows=sm.model.type_vocab_size)
    eos = sm.tokenizer.eos_id
    return encoding.Layout(encoder=False, sep=eos, pad=eos)


def encode(cfg: FinetuneConfig, records: Sequence[dict[str, Any]], tokenizer: Any,
           layout: encoding.Layout) -> encoding.Encoded:
    """One split's records as arrays for ``cfg.task``'s head."""
    kind = cfg.task.kind
    if kind == "classification":
        return encoding.encode_classification(records, cfg.task.labels, tokenizer, layout, cfg.max_len, cfg.pooling)
    if kind == "multiple_choice":
        return encoding.encode_multiple_choice(records, tokenizer, layout, cfg.max_len, cfg.pooling)
    return encoding.encode_qa(records, tokenizer, layout, cfg.max_len, cfg.doc_stride)


def _sample(records: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """At most ``cap`` records (0: all), a fixed seeded sample in the source's order: the same
    for every seed and system, so their scores compare on the same examples."""
    if not cap or len(records) <= cap:
        return records
    keep = np.sort(np.random.default_rng(0).choice(len(records), cap, replace=False))
    return [records[i] for i in keep]


# ----------------------------------------------------------------------------- one seed
class _Job:
    """One seed's fine-tuning: state, data order, checkpoints, evaluation."""

    def __init__(self, cfg: FinetuneConfig, sm: StageModel, mesh: Mesh, train: encoding.Encoded,
                 valid: encoding.Encoded, valid_records: list[dict[str, Any]], directory: Path, seed: int,
                 signals: Any, log: Callable[[str], None], on_step: Callable[[int], None] | None = None, *,
                 made_of: dict[str, Any], progress: bool = False) -> None:
        self.cfg, self.sm, self.mesh, self.seed, self.log, self.on_step = cfg, sm, mesh, seed, log, on_step
        self.progress, self.say = progress, log  # progress: a bar or lines with an ETA from the first step
        self.made_of = made_of  # the checkpoint and data every stored state of this job names
        self.train, self.valid, self.valid_records = train, valid, valid_records
        self.directory, self.signals = directory, signals
        self.steps_per_epoch = max(len(train) // cfg.batch_size, 1)
        self.total = self.steps_per_epoch * cfg.epochs
        # SQuAD 2.0's rule (predict no answer when it scores higher) only where the task has
        # unanswerable questions; an answer cut off by truncation does not make it one
        self.allow_null = cfg.task.kind == "qa" and any(not r["answers"] for r in valid_records)

    # data ---------------------------------------------------------------------------
    def batch_indices(self, step: int) -> np.ndarray:
        """The training examples of ``step``: a permutation per (seed, epoch), cut into batches."""
        epoch, b = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
        return order[b * self.cfg.batch_size:(b + 1) * self.cfg.batch_size]

    @staticmethod
    def _rows(enc: encoding.Encoded, idx: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return ({k: v[idx] for k, v in enc.inputs.items()}, {k: v[idx] for k, v in enc.targets.items()})

    # state ----------------------------------------------------------------------------
    def initial_state(self, optimizer: optax.GradientTransformation) -> tuple[Any, jax.Array]:
        """Step 0: the stage's parameters (sharded by the partition rules), a fresh head
        (replicated, drawn from the seed) and fresh optimizer moments; and the layer gates,
        constants of the finished stage."""
        from loire_jax.model.params import abstract_params
        from loire_jax.parallel.sharding import opt_state_shardings, param_shardings
        from loire_jax.store import checkpoints
        from loire_jax.train.state import TrainState

        model = self.sm.model
        shardings = param_shardings(model, self.mesh)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                abstract_params(model), shardings)
        made = self.made_of["checkpoint"]  # the very step that was digested, or a refusal
        params = checkpoints.restore_params(self.sm.directory, abstract, step=made["step"], digest=made["digest"])
        gates = params.pop(GATES)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        head = jax.jit(lambda k: heads.init_head(self.cfg.task.kind, model.hidden, self.cfg.task.num_labels,
                                                 model.encoder, k, model.init_std),
                       out_shardings=replicated)(jax.random.key(self.seed))
        tree = {"backbone": params, "head": head}
        # moments where their parameter lives (found by optax), counters replicated: the same
        # layout whether the state is fresh or restored, on this mesh or another
        where = {"backbone": {k: v for k, v in shardings.items() if k != GATES},
                 "head": jax.tree.map(lambda _: replicated, head)}
        opt_where = opt_state_shardings(optimizer, jax.eval_shape(optimizer.init, tree), where, self.mesh)
        opt_state = jax.jit(optimizer.init, out_shardings=opt_where)(tree)
        step = jax.device_put(jnp.zeros((), jnp.int32), replicated)
        return TrainState(params=tree, opt_state=opt_state, step=step), gates

    # evaluation -----------------------------------------------------------------------
    def evaluate(self, programs: Programs, params: dict[str, Any]) -> dict[str, float]:
        """The validation split's loss and score (the task's metric, percent)."""
        n, bs, ways = len(self.valid), self.cfg.eval_batch_size, data_ways(self.mesh)
        bs = -(-bs // ways) * ways
        outputs, losses, weights = [], [], []
        for lo in range(0, n, bs):
            idx = np.arange(lo, lo + bs)
            w = (idx < n).astype(np.float32)
            inputs, targets = self._rows(self.valid, np.minimum(idx, n - 1))
            logits, loss = programs.eval_step(params, programs.put(inputs), programs.put(targets),
                                              programs.put({"w": w})["w"])
            outputs.append(jax.tree.map(host, logits))
            losses.append(float(loss) * w.sum())
            weights.append(w.sum())
        result = {"loss": sum(losses) / sum(weights)}
        kind, task = self.cfg.task.kind, self.cfg.task
        if kind == "qa":
            start = np.concatenate([o[0] for o in outputs])[:n]
            end = np.concatenate([o[1] for o in outputs])[:n]
            preds = encoding.qa_answers(self.valid_records, self.valid, start, end, self.allow_null)
            scores = scoring.squad_scores_in_order(preds, [[a["text"] for a in r["answers"]]
                                                           for r in self.valid_records])
            result.update(exact_match=scores["exact_match"], f1=scores["f1"], score=scores["f1"])
            return {k: float(v) for k, v in result.items()}
        pred = np.argmax(np.concatenate(outputs)[:n], axis=-1)
        gold = self.valid.targets["label"]
        result["score"] = scoring.classification_score(task.metric, pred, gold, task.num_labels)
        if task.metric != "accuracy":
            result["accuracy"] = scoring.accuracy(pred, gold)
        return {k: float(v) for k, v in result.items()}

    # the loop -------------------------------------------------------------------------
    def run(self) -> SeedResult | int:
        """Train (or resume) to the end and return the result, or the signal number that
        stopped it after a save."""
        from loire_jax.store import checkpoints
        from loire_jax.train.state import TrainState

        cfg = self.cfg
        optimizer = finetune_optimizer(cfg, self.total)
        ck_dir = self.directory / "checkpoints"
        every = cfg.save_every or self.steps_per_epoch
        with checkpoints.StageCheckpoints(ck_dir, save_every=every, keep=cfg.keep) as ck:
            state, gates = self.initial_state(optimizer)
            layout = jax.tree.map(lambda x: x.sharding, state)
            programs = Programs(self.sm.model, cfg.task.kind, self.mesh, optimizer, gates, layout)
            history: dict[str, list] = {"train": [], "eval": []}
            start = 0
            if ck.latest_step() is not None:
                abstract = jax.tree.map(lambda x, w: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=w), state, layout)
                state, meta = ck.restore(abstract)
                if provenance.changes(meta.get(provenance.PROVENANCE), self.made_of):  # check_job ran first
                    raise FinetuneError(f"{ck_dir} holds another checkpoint's or data's job; move {self.directory} "
                                        "aside and rerun")
                history = meta["history"]
                start = int(state.step)
                self.log(f"  seed {self.seed}: resumed at step {start} of {self.total}")
            assert isinstance(state, TrainState)
            t0, pending = time.perf_counter(), None
            log_every = max(1, self.steps_per_epoch // 4)
            shown = JobProgress(f"  seed {self.seed}", start, self.total, self.log, bar=bar_wanted()) \
                if self.progress else None
            self.say = shown.write if shown is not None else self.log
            with self.signals.deferred(), contextlib.closing(shown) if shown else contextlib.nullcontext():
                for step in range(start, self.total):
                    inputs, targets = self._rows(self.train, self.batch_indices(step))
                    weights = np.ones(len(targets[next(iter(targets))]), np.float32)
                    state, loss = programs.train_step(state, programs.put(inputs), programs.put(targets),
                                                      programs.put({"w": weights})["w"])
                    if pending is not None:  # metrics one step late: never wait on the step just queued
                        self._record(history, *pending, log_every)
                    pending, done = (step, loss), step + 1
                    if self.on_step is not None:
                        self.on_step(done)
                    if shown is not None:
                        shown.step(done)
                    epoch_end = done % self.steps_per_epoch == 0
                    # one collective per check with several processes: only where a save may fall
                    check = jax.process_count() == 1 or done % every == 0 or epoch_end
                    stop = check and done < self.total and self.signals.should_stop()
                    if epoch_end or stop or done % every == 0:  # a save point: the history must be complete
                        self._record(history, *pending, log_every)
                        pending = None
                    if epoch_end:
                        self._epoch_end(programs, state.params, history, done)
                    if epoch_end or stop or done % every == 0:
                        ck.save(done, state, meta={"history": history, "config": cfg.to_dict(), "seed": self.seed,
                                                   provenance.PROVENANCE: self.made_of}, force=epoch_end or stop)
                    if stop:
                        ck.wait()
                        return int(self.signals.signum or 15)
            if self.total == 0:  # epochs 0: the untrained head's score
                history["eval"].append({"epoch": 0, "step": 0, **self.evaluate(programs, state.params)})
            ck.wait()
        wall = time.perf_counter() - t0
        final = history["eval"][-1]
        result = {"task": cfg.task.name, "stage": self.sm.stage, "seed": self.seed, "metric": self._metric_name(),
                  "score": final["score"], "epochs": history["eval"], "train": history["train"],
                  "steps": self.total, "train_examples": self.train.examples,
                  "validation_examples": self.valid.examples,
                  "truncated": {"train": self.train.truncated, "validation": self.valid.truncated},
                  "wall_s_last_call": round(wall, 2), "config": cfg.to_dict(), provenance.PROVENANCE: self.made_of,
                  "baseline": baselines.baseline(cfg, self.valid_records)}  # of the examples scored
        if cfg.task.kind == "qa":  # rows the model read: a long context's windows
            result["windows"] = {"train": len(self.train), "validation": len(self.valid)}
        if jax.process_index() == 0:  # one writer; every process holds the same history
            self._write(result, history)
        return SeedResult(self.seed, final["score"], self._metric_name(), history["eval"], self.directory)

    def _write(self, result: dict[str, Any], history: dict[str, list]) -> None:
        paths.write_atomic(self.directory / METRICS, "".join(json.dumps(r) + "\n" for r in
                                                             history["train"] + [dict(e, kind="eval")
                                                                                 for e in history["eval"]]))
        paths.write_atomic(self.directory / RESULTS, json.dumps(result, indent=1))  # last: it marks the job done

    def _epoch_end(self, programs: Programs, params: Any, history: dict, done: int) -> None:
        """Score the validation split after an epoch, into the history and the log."""
        epoch = done // self.steps_per_epoch
        scores = self.evaluate(programs, params)
        history["eval"].append({"epoch": epoch, "step": done, **scores})
        name = "F1" if self.cfg.task.kind == "qa" else self.cfg.task.metric
        self.say(f"  seed {self.seed} epoch {epoch}/{self.cfg.epochs}: validation {name} {scores['score']:.2f}, "
                 f"loss {scores['loss']:.4f}")

    def _metric_name(self) -> str:
        return "f1" if self.cfg.task.kind == "qa" else self.cfg.task.metric

    @staticmethod
    def _record(history: dict, step: int, loss: jax.Array, every: int) -> None:
        if (step + 1) % every == 0 or not history["train"]:
            history["train"].append({"step": step + 1, "loss": float(loss)})


# ----------------------------------------------------------------------------- the library call
def finetune(run_dir: paths.PathLike, task: str | TaskConfig | FinetuneConfig, cfg: FinetuneConfig | None = None, *,
             stage: int | None = None, seeds: Sequence[int] | None = None, overrides: Sequence[str] = (),
             mesh: Mesh | str | None = None, log: Callable[[str], None] = print,
             on_step: Callable[[int], None] | None = None, progress: bool = False,
             max_len_given: bool | None = None, prepared: Prepared | None = None) -> FinetuneResult:
    """Fine-tune stage ``stage`` (default: the last) of the run in ``run_dir`` on ``task`` at
    each seed (default: ``cfg.seed``), and write each seed's metrics and results, and a
    summary, under ``<run_dir>/finetune/<task>/stage<k>/``.

    ``task``: a shipped task name (``configs/tasks/<name>.yaml``) or a task YAML path, with
    ``overrides`` (``lr=1e-4``); or a ``TaskConfig`` with ``cfg`` for the hyper-parameters;
    or a whole ``FinetuneConfig``. Everything that can be refused (the run, the stage, the
    task's files and records, the head on this model, the mesh) is refused before any
    compute, with a one-line ``LoireError``. Under SIGTERM/SIGINT (main thread) the job
    saves and returns with ``stopped`` set; calling again resumes it. ``on_step(step)`` is
    called after each training step is dispatched (a progress bar's hook); ``progress``
    shows a bar on a terminal, else lines through ``log``, from the first step, with an ETA.

    A ``max_len`` above the model's ``max_seq_len`` is lowered to it (said in the job's first
    line) where it is the task's default, and refused where the user set it
    (``max_len_given``; default: ``max_len`` is among ``overrides``, or ``cfg`` or a whole
    ``FinetuneConfig`` was given).

    ``prepared``: this job's ``prepare`` made earlier (a command with several tasks checks
    them all before the first job runs); it carries the config as the model allows it.
    """
    from loire_jax.config.loader import load_finetune_config
    from loire_jax.train.signals import RunSignals, Stopped, stop_within

    if max_len_given is None:
        max_len_given = isinstance(task, FinetuneConfig) or cfg is not None or given(overrides, "max_len")
    if isinstance(task, FinetuneConfig):
        cfg = task
    elif isinstance(task, TaskConfig):
        cfg = dataclasses.replace(cfg, task=task) if cfg is not None else FinetuneConfig(task=task)
    elif cfg is None:
        cfg = load_finetune_config(task, overrides)
    if prepared is None:  # every check of the task, its records and the model, before the job's folder is read
        prepared = prepare(run_dir, cfg, stage, mesh, max_len_given)
    cfg, sm, mesh, (train, train_records), (valid, valid_records), data, note = prepared
    made_of = provenance.record(sm.directory, sm.stage, sm.run.stages[sm.stage - 1].steps, data)  # once per call
    seeds = list(seeds) if seeds is not None else [cfg.seed]
    root = paths.as_path(run_dir) / FINETUNE_DIR / cfg.job_name / f"stage{sm.stage}"
    out: list[SeedResult] = []
    signals = RunSignals()
    several = jax.process_count() > 1  # a peer's failure or loss ends this process too, not a hang
    writer = jax.process_index() == 0
    try:
        with signals, peers.PeerWatch() if several else contextlib.nullcontext(), \
                provenance.job_lock(root, writer, log, doing=f"fine-tuning {cfg.job_name} on stage {sm.stage}"):
            # under the lock: an earlier job is reused or resumed only while what made it still holds
            reuse = {seed: provenance.check_job(root / f"seed{seed}", dataclasses.replace(cfg, seed=seed), made_of,
                                                log, writer=writer) for seed in seeds}
            if several:  # every process decided before process 0's moves change what the others read
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("fine-tuning jobs checked")
            log(f"fine-tuning stage {sm.stage} ({sm.run.stages[sm.stage - 1].name}) of {sm.run.name} on "
                f"{cfg.job_name} ({cfg.task.kind}, {train.examples} train / {valid.examples} validation examples"
                + (f" in {len(train)} / {len(valid)} windows" if len(train) + len(valid) > train.examples
                   + valid.examples else "") + f", {cfg.epochs} epochs of {len(train) // cfg.batch_size} steps) "
                f"at seeds {seeds}" + (f"; {note}" if note else ""))
            base = baselines.baseline(cfg, valid_records)
            log(f"  trivial baseline: {base['answer']} scores {base['score']:.2f} ({base['name']}; noise ± "
                f"{base['noise']:.2f} over {base['n']} validation examples)")
            stopped = _run_seeds(cfg, sm, mesh, train, valid, valid_records, root, reuse, made_of, signals, log,
                                 on_step, out, progress)
            if stopped is None and writer:
                _write_summary(root, FinetuneResult(cfg.job_name, sm.stage, out[0].metric, out), made_of)
    except Stopped:
        raise
    except BaseException as err:
        if several and stop_within(err) is None:
            peers.failed_alone(err)
        raise
    if stopped is not None:
        return FinetuneResult(cfg.job_name, sm.stage, cfg.task.metric, out, stopped=stopped, baseline=base)
    return FinetuneResult(cfg.job_name, sm.stage, out[0].metric, out, baseline=base)


def _run_seeds(cfg: FinetuneConfig, sm: Any, mesh: Mesh, train: Any, valid: Any, valid_records: Any, root: Path,
               reuse: dict[int, dict[str, Any] | None], made_of: dict[str, Any], signals: Any,
               log: Callable[[str], None], on_step: Callable[[int], None] | None, out: list[SeedResult],
               progress: bool = False) -> int | None:
    """Each seed's job in turn (``reuse``: seed -> its stored results that still hold, or
    None); appends to ``out`` and returns the stopping signal's number, or None when every
    seed is done."""
    for seed, saved in reuse.items():
        directory = root / f"seed{seed}"
        if saved is not None:
            log(f"  seed {seed}: done earlier, {saved['metric']} {saved['score']:.2f}")
            out.append(SeedResult(seed, saved["score"], saved["metric"], saved["epochs"], directory, True))
            continue
        directory.mkdir(parents=True, exist_ok=True)
        job = _Job(dataclasses.replace(cfg, seed=seed), sm, mesh, train, valid, valid_records, directory, seed,
                   signals, log, on_step, made_of=made_of, progress=progress)
        got = job.run()
        if isinstance(got, int):
            return got
        out.append(got)
    return None


class Prepared(NamedTuple):
    """A job checked and its data encoded, before any of its stored state is read."""

    cfg: FinetuneConfig  # as the model allows it (``fit_max_len``)
    sm: StageModel
    mesh: Mesh
    train: tuple[encoding.Encoded, list[dict[str, Any]]]  # (arrays, records)
    valid: tuple[encoding.Encoded, list[dict[str, Any]]]
    data: dict[str, Any]  # each split's record for provenance
    note: str  # what was changed, for the job's first line


def prepare(run_dir: paths.PathLike, cfg: FinetuneConfig, stage: int | None = None, mesh: Mesh | str | None = None,
            max_len_given: bool = True) -> Prepared:
    """Every check of one job, made before its folder is read (a stored job of other settings
    is refused only once the task itself holds): the run and the stage, the task's settings
    against the model and the mesh, the task's records; and the records encoded."""
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.parallel.sharding import check_divisible, make_mesh

    sm = stage_model(run_dir, stage)
    cfg, note = fit_max_len(cfg, sm.model.max_seq_len, max_len_given)
    try:
        encoding.resolved_pooling(cfg.pooling, sm.model.encoder)
    except ValueError as err:
        raise FinetuneError(str(err)) from None
    if not isinstance(mesh, Mesh):
        mesh = make_mesh(parse_mesh(mesh or cfg.mesh or sm.run.mesh))
    try:
        check_divisible(sm.model, mesh)
    except ValueError as err:
        raise FinetuneError(str(err)) from None
    ways = data_ways(mesh)
    if cfg.batch_size % ways:
        raise FinetuneError(f"batch_size {cfg.batch_size} does not split over the mesh's {ways} data-parallel ways")
    examples = load_examples(cfg.task, sm.run.data.root / "downloads")
    data = provenance.data_record(cfg.task, examples)  # every record read, before any sample
    train_records = _sample(examples["train"], cfg.max_train_examples)
    valid_records = _sample(examples["validation"], cfg.max_eval_examples)
    if len(train_records) < cfg.batch_size:
        raise FinetuneError(f"task {cfg.task.name!r} has {len(train_records)} training examples, fewer than "
                            f"batch_size {cfg.batch_size}")
    layout = _layout(sm)
    try:
        train, valid = (encode(cfg, r, sm.tokenizer, layout) for r in (train_records, valid_records))
    except ValueError as err:
        raise TaskError(f"task {cfg.task.name!r}: {str(err).splitlines()[0]}") from None
    return Prepared(cfg, sm, mesh, (train, train_records), (valid, valid_records), data, note)


def _write_summary(root: Path, result: FinetuneResult, made_of: dict[str, Any]) -> None:
    mean, half = result.mean_half_range
    summary = {"task": result.task, "stage": result.stage, "metric": result.metric, "mean": mean,
               "half_range": half, "seeds": {s.seed: s.score for s in result.seeds}, provenance.PROVENANCE: made_of}
    paths.write_atomic(root / "summary.json", json.dumps(summary, indent=1))
