"""How a cached stage runs: fingerprint → catalog lookup → compute → atomic write → catalog row.

A stage is declared once, with the parameters it takes (:func:`stage`, :class:`StageParams`); those
parameters are its fingerprint's config part, and its code identity is derived from its function.

Two kinds of stage:
- :func:`run_stage` — a whole-table stage (ingest, graphs, indexes). Same fingerprint → skipped.
- :func:`run_row_stage` — a per-row stage (chunk, NER, embed). Rows are cached by a content key
  under the stage's *param* fingerprint (code + config, not inputs), so a grown corpus computes
  only its new rows and a shrunk one simply selects fewer.

Prefect sees every stage as a task named ``stage[fp]``; the catalog, not Prefect's result store,
decides what is skipped, because only the catalog knows whether the files still exist. A stage
is computed under a per-(stage, fingerprint) file lock, so two runs sharing an ``artifacts_dir``
compute it once: the second waits and reuses it.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Mapping

import pandas as pd
import pyarrow as pa

from tasks.core.progress import notice_if_slow
from tasks.core.files import DamagedFile, TableStream, write_bytes, write_parquet, write_parquet_stream
from tasks.core.hashing import fingerprint, short_hash
from tasks.core.locks import stage_lock
from tasks.core.memory import PeakRSS, release_arrow_memory
from tasks.core.store import ArtifactRef, Store

log = logging.getLogger("dagrag")

Output = pd.DataFrame | pa.Table | bytes | TableStream


@dataclass(frozen=True)
class RunContext:
    """What every task needs to reach the store: small and picklable."""

    artifacts_dir: str
    dataset: str
    run_id: str
    llm_dry_run: bool = False  # LLM stages estimate their calls and raise tasks.llm.params.LLMDryRun instead
    # open a built index: every stage is looked up in the catalog, none computed, no event recorded; a stage
    # that is not there raises StageNotBuilt (flows.serving.index)
    resolve_only: bool = False
    # plan a run (flows.commands.plan): every stage is fingerprinted and looked up, none computed; what each would
    # do is added to this plan (tasks.core.plan.Plan), and its outputs are placeholders with their fingerprints
    plan: Any = None

    @property
    def direct(self) -> bool:
        """Stages are called as plain functions (no Prefect task): nothing is computed in these modes."""
        return self.resolve_only or self.plan is not None

    @property
    def store(self) -> Store:
        return Store(self.artifacts_dir)


class StageNotBuilt(LookupError):
    """A stage of the index being opened is not in the catalog (``RunContext.resolve_only``), or is recorded but
    cannot be trusted (``damage``: what is wrong with its record or a file)."""

    def __init__(self, stage: str, fp: str, damage: str | None = None) -> None:
        super().__init__(f"stage {stage!r} [{fp}] " + (f"is damaged: {damage}" if damage else "is not in the catalog"))
        self.stage, self.fp, self.damage = stage, fp, damage


# ----------------------------------------------------------------------------- declared stages

_ROLE = "stage"  # the field-metadata key of a stage parameter's role (see StageParams)


def from_config(key: str, default: Any = dataclasses.MISSING) -> Any:
    """A stage parameter read from the config under another name: ``key`` is a field of one of the class's
    ``SOURCES`` (``"chunk_unit"``) or a ``"group.field"`` (``"llm.model"``)."""
    return dataclasses.field(default=default, kw_only=True, metadata={_ROLE: {"role": "config", "key": key}})


def run_setting(default: Any = dataclasses.MISSING, key: str | None = None) -> Any:
    """A stage parameter that decides how the stage runs (a batch size, a device) or whether it refuses its input
    (a length limit), never the value of an output: read from the config like the others, not fingerprinted."""
    return dataclasses.field(default=default, kw_only=True, metadata={_ROLE: {"role": "run", "key": key}})


def wired(default: Any = dataclasses.MISSING) -> Any:
    """A stage parameter the flow calling the stage passes (which id column, whether passages are rendered with
    their title): part of the fingerprint, never read from the config."""
    return dataclasses.field(default=default, kw_only=True, metadata={_ROLE: {"role": "wired"}})


def _role(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata.get(_ROLE, {"role": "config", "key": None})


@dataclass(frozen=True)
class StageParams:
    """Base of every stage's parameters: a frozen dataclass of exactly what its compute body reads.

    A field is one of three kinds:

    * a config field (the default): read from the composed config by :meth:`of`, under its own name from one of
      ``SOURCES`` (the config groups it may come from, in order: ``("method",)``, ``("embedder",)``) or under
      the name :func:`from_config` gives; fingerprinted;
    * :func:`run_setting`: read likewise, but it decides how the stage runs, not what it computes: not
      fingerprinted;
    * :func:`wired`: passed by the flow calling the stage (``id_col="doc_id"``); fingerprinted.

    The three helpers make their fields keyword-only, so they may come in any order.

    A config field no source holds takes its default (a method without ``window_tokens`` chunks with the
    default window); one without a default is an error naming the sources.
    """

    SOURCES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, config: Any, **given: Any) -> "StageParams":
        """These parameters of a composed config (``flows.runtime.config.Config``): the one projection every flow uses.

        ``given`` sets wired fields, and may set a config field where the flow fixes it for its method
        (EraRAG's leaves are token windows: ``ChunkParams.of(cfg, unit="window")``)."""
        return cls(**cls.values_of(config, **given))

    @classmethod
    def values_of(cls, config: Any, **given: Any) -> dict[str, Any]:
        """The field values :meth:`of` builds the params from (a config field no source holds: absent, its
        default applies)."""
        values: dict[str, Any] = {}
        unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        for f in dataclasses.fields(cls):
            role = _role(f)
            if f.name in given:
                values[f.name] = given[f.name]
                continue
            if role["role"] != "wired":
                found = config_value(config, cls.SOURCES, role.get("key") or f.name)
                if found is not _ABSENT:
                    values[f.name] = found
                    continue
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                where = ("the flow passes it" if role["role"] == "wired" else
                         f"config {role.get('key') or f.name!r} in {', '.join(cls.SOURCES) or 'no source'}")
                raise TypeError(f"{cls.__name__}.{f.name} has no value: {where}")
        return values

    def identity(self) -> dict[str, Any]:
        """The fingerprinted part: every field but the :func:`run_setting` ones and those :meth:`unused` names, as
        plain data."""
        unused = self.unused()
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if _role(f)["role"] != "run" and f.name not in unused}

    def unused(self) -> frozenset[str]:
        """The fields these values make the stage ignore (an embed that renders no template ignores the template),
        left out of the fingerprint so that changing them rebuilds nothing. None by default."""
        return frozenset()


_ABSENT = object()


def config_value(config: Any, sources: tuple[str, ...], key: str) -> Any:
    """The config leaf ``key`` ("group.field", or a field of the first of ``sources`` that has it), or ``_ABSENT``."""
    if "." in key:
        group, name = key.split(".", 1)
        candidates = [(getattr(config, group, None), name)]
    else:
        candidates = [(getattr(config, s, None), key) for s in sources]
    for obj, name in candidates:
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            return getattr(obj, name)
    return _ABSENT


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


@dataclass(frozen=True)
class Stage:
    """A registered stage: its catalog name, its function and its parameter class."""

    name: str
    fn: Callable
    params: type

    def code(self) -> str:
        """The stage's code identity: everything its function runs (:func:`tasks.core.code_identity.code_version`)."""
        from tasks.core.code_identity import code_version

        return code_version(self.fn)


STAGES: dict[type, Stage] = {}  # parameter class -> its stage (one class per stage)


def stage(name: str, *, params: type | tuple[type, ...]) -> Callable[[Callable], Any]:
    """Declare a stage: ``@stage("doc_doc_graph", params=DocDocParams)`` over ``def doc_doc_graph(ctx, params,
    *inputs)``.

    The function becomes a :class:`StageTask` (a Prefect task named ``name`` in a run), is
    registered in :data:`STAGES` under its parameter class, and must be called with an instance of exactly that
    class as ``params``: the only configuration it reads. Its body hands its outputs to :func:`run_stage` (or
    :func:`run_row_stage`) with those params, which fingerprint them with the function's code identity and
    the inputs' fingerprints.

    A new stage declares its params as a frozen dataclass subclassing :class:`StageParams` with ``SOURCES``
    (the config groups its fields come from, by name), marks fields :func:`from_config` (another name),
    :func:`run_setting` (not fingerprinted) or :func:`wired` (set by the flow), and its flow calls it with
    ``Params.of(cfg, **wired)``. ``tests/tasks/core/test_stage_params.py`` checks every registered stage.
    Several stages may share a catalog name (one ``ingest`` per dataset kind), never a parameter class. A stage
    whose variants read different settings takes a tuple of classes (an extractive or an LLM summariser): its
    flow picks the variant, and each variant's params are exactly what that variant reads.
    """
    classes = params if isinstance(params, tuple) else (params,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, StageParams) and dataclasses.is_dataclass(cls)
                and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            raise TypeError(f"stage {name!r}: params must be frozen dataclasses subclassing StageParams, got {cls!r}")
    expected = " or ".join(c.__name__ for c in classes)

    def declare(fn: Callable) -> "StageTask":
        signature = inspect.signature(fn)
        if "params" not in signature.parameters:
            raise TypeError(f"stage {name!r}: {fn.__qualname__} takes no 'params' argument")
        for cls in classes:
            if cls in STAGES and STAGES[cls].fn.__qualname__ != fn.__qualname__:
                raise TypeError(f"{cls.__name__} is already the params of stage {STAGES[cls].name!r}")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            got = signature.bind(*args, **kwargs).arguments["params"]
            if type(got) not in classes:
                raise TypeError(f"stage {name!r} takes {expected} params, got {type(got).__name__}: "
                                f"build them with {classes[0].__name__}.of(cfg)")
            return fn(*args, **kwargs)

        for cls in classes:
            STAGES[cls] = Stage(name, fn, cls)
        return StageTask(name, checked)

    return declare


class StageTask:
    """What ``@stage`` makes of a function: called (or ``submit``-ted) as a flow calls a Prefect task.

    Where a stage runs is decided here, from the :class:`RunContext` it is called with (its first argument):

    * a normal run: the call is handed to a Prefect task named after the stage (no Prefect result cache: the
      catalog decides what is skipped), made on first use, so a process that only resolves never imports Prefect;
    * :attr:`RunContext.direct` (opening a built index, or a plan): the function is called in this thread, and
      ``submit`` returns a :class:`Done` holding its value. Nothing is computed either way in those modes
      (:func:`run_named_stage`), so there is nothing to run concurrently, and no Prefect run or server is started.

    ``fn`` is the checked function itself, as a Prefect task's is (tests call ``stage.fn(ctx, params, …)``).
    """

    def __init__(self, name: str, fn: Callable) -> None:
        self.name, self.fn = name, fn
        self._task: Any = None
        self._run_name: Any = None
        functools.update_wrapper(self, fn)

    @property
    def task(self) -> Any:
        """The Prefect task a normal run hands the call to."""
        if self._task is None:
            from prefect import task
            from prefect.cache_policies import NO_CACHE

            self._task = task(name=self.name, cache_policy=NO_CACHE, task_run_name=self._run_name)(self.fn)
        return self._task

    @property
    def task_run_name(self) -> Any:
        return self._run_name

    @task_run_name.setter
    def task_run_name(self, value: Any) -> None:
        """How its task runs are named in the UI (``flows.runtime.observe``): set before or after the task exists."""
        self._run_name = value
        if self._task is not None:
            self._task.task_run_name = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs) if _direct(args, kwargs) else self.task(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """A future of the stage's outputs: a Prefect future in a run, an already computed :class:`Done` else."""
        return Done(self.fn(*args, **kwargs)) if _direct(args, kwargs) else self.task.submit(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<stage {self.name} {self.fn.__module__}.{self.fn.__qualname__}>"


def _direct(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    ctx = args[0] if args else kwargs.get("ctx")
    if not isinstance(ctx, RunContext):
        raise TypeError(f"a stage takes its RunContext first, got {type(ctx).__name__}")
    return ctx.direct


class Done:
    """What ``submit`` returns where a stage is called directly: its value, already there (a future's API)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, *args: Any, **kwargs: Any) -> Any:
        return self.value

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None


def stage_of(params: StageParams) -> Stage:
    """The registered stage these params belong to."""
    try:
        return STAGES[type(params)]
    except KeyError:
        raise TypeError(f"{type(params).__name__} is the params of no registered stage (@stage(..., "
                        f"params={type(params).__name__}))") from None


def stage_fingerprint(params: StageParams, inputs: Mapping[str, str]) -> str:
    """The fingerprint :func:`run_stage` gives a stage with these params and inputs."""
    spec = stage_of(params)
    return fingerprint(spec.name, spec.code(), params.identity(), inputs)


def stored_versions(store: Store, params: StageParams, output: str, dataset: str
                    ) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(fp, path, inputs)`` of every stored ``output`` of this stage on ``dataset`` with these params that this
    code made (its fingerprint is the one this code gives those inputs), in the catalog's order: the versions an
    update may start from."""
    spec = stage_of(params)
    code, identity = spec.code(), params.identity()
    for fp, path, inputs in store.versions(spec.name, output, dataset, identity):
        if fingerprint(spec.name, code, identity, inputs) == fp:
            yield fp, path, inputs


def run_stage(ctx: RunContext, params: StageParams, inputs: Mapping[str, str],
              compute: Callable[[], tuple[Mapping[str, Output], int]], ext: Mapping[str, str] | None = None,
              ) -> dict[str, ArtifactRef]:
    """The stage whose params these are, run by :func:`run_named_stage` with its name, code identity and params."""
    spec = stage_of(params)
    return run_named_stage(ctx, spec.name, spec.code(), params.identity(), inputs, compute, ext)


def run_row_stage(ctx: RunContext, params: StageParams, row_params: Any, inputs: Mapping[str, str],
                  keys: Callable[[], pd.Series] | pd.Series,
                  compute_rows: Callable[[list[str]], pa.Table | pd.DataFrame], key: str,
                  assemble: Callable[[Any], Mapping[str, Output]], stream: bool = False,
                  max_partition_rows: int = 0) -> dict[str, ArtifactRef]:
    """A per-row stage whose params these are (:func:`run_named_row_stage`); ``row_params`` derive from them."""
    spec = stage_of(params)
    return run_named_row_stage(ctx, spec.name, spec.code(), params.identity(), row_params, inputs, keys,
                               compute_rows, key, assemble, stream, max_partition_rows)


# an input a stage's fingerprint reads from another stage's output (EraRAG's hyperplanes: the embeddings' width),
# in a plan where that output is not built yet: the fingerprint is known once it is
UNKNOWN_INPUT = "?"


def planned(ref: ArtifactRef) -> bool:
    """Whether ``ref`` is a plan's placeholder for an output not built yet (:mod:`tasks.core.plan`): no file."""
    return ref.path == ""


def params_dict(params: Any) -> Any:
    """Stage params as plain JSON data (dataclasses become dicts)."""
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params


def input_fps(**refs: ArtifactRef | Mapping[str, ArtifactRef] | None) -> dict[str, str]:
    """Flatten input references into ``{name: fp}`` for a fingerprint."""
    out: dict[str, str] = {}
    for key, ref in refs.items():
        if ref is None:
            continue
        if isinstance(ref, ArtifactRef):
            out[key] = ref.fp
        else:
            out.update({f"{key}.{k}": v.fp for k, v in ref.items()})
    return out


def run_named_stage(ctx: RunContext, stage: str, code: str, params: Any, inputs: Mapping[str, str],
                    compute: Callable[[], tuple[Mapping[str, Output], int]], ext: Mapping[str, str] | None = None,
                    new_rows: Callable[[Store], tuple[int, int]] | None = None) -> dict[str, ArtifactRef]:
    """Run ``compute`` unless a stage with the same fingerprint is in the catalog; return output refs.

    ``compute`` returns ``({name: table-or-bytes}, rows_computed)``. After a catalog miss the stage's
    lock is taken (:func:`tasks.core.locks.stage_lock`) and the catalog is read again: a run that finds another
    process computing the same stage waits for it and then reuses its outputs ('cached'), so
    concurrent runs on one ``artifacts_dir`` compute each stage once. If the other process fails or
    is killed, the lock is released and this run computes the stage itself.

    In a plan (``ctx.plan``) nothing is looked up here or computed: the plan records the stage and returns its
    refs, placeholders where it would compute (``new_rows(store)``: a per-row stage's ``(new, total)`` rows).
    """
    fp = fingerprint(stage, code, params_dict(params), inputs)
    if ctx.plan is not None:
        return ctx.plan.add(stage, fp, params_dict(params), inputs, new_rows)
    store = ctx.store
    t0 = time.perf_counter()
    if ctx.resolve_only:  # nothing is computed here, so a damaged stage is named, not announced as computed again
        found, damage = store.examine_record(stage, fp)
        if found is None:
            raise StageNotBuilt(stage, fp, damage)
        return found
    hit = store.lookup(stage, fp)
    if hit is None:
        def waiting(pid: int | None) -> None:
            log.info("waiting for %s [%s], being computed by another run%s", stage, fp,
                     f" (pid {pid})" if pid else "")

        with stage_lock(store.root, stage, fp, on_wait=waiting):
            hit = store.lookup(stage, fp, warn=False)  # another run may have finished it while we waited
            if hit is None:
                return _compute(ctx, store, stage, fp, params, inputs, compute, ext or {})
    rows = sum(r.rows for r in hit.values())
    seconds = time.perf_counter() - t0  # includes any wait for another run computing it
    store.event(ctx.run_id, stage, fp, ctx.dataset, "cached", rows=rows, rows_computed=0,
                seconds=seconds, peak_rss_mb=0.0)
    log.info("%-14s cached    [%s]%s", stage, fp, f" after waiting {seconds:.1f} s" if seconds >= 1 else "")
    return hit


def _compute(ctx: RunContext, store: Store, stage: str, fp: str, params: Any, inputs: Mapping[str, str],
             compute: Callable[[], tuple[Mapping[str, Output], int]], ext: Mapping[str, str],
             ) -> dict[str, ArtifactRef]:
    """Compute a stage, write its outputs, record it (the caller holds its lock)."""
    t0 = time.perf_counter()
    with PeakRSS() as mem, notice_if_slow("%-14s computing [%s] …", stage, fp):
        outputs, rows_computed = compute()
        refs = _write_outputs(store, ctx.dataset, stage, fp, outputs, ext)
    del outputs
    release_arrow_memory()  # the next stage's RSS starts from what is live, not from this stage's tables
    seconds = time.perf_counter() - t0
    refs = store.record(stage, fp, ctx.dataset, refs, input_fps=inputs, params=params_dict(params),
                        rows_computed=rows_computed, seconds=seconds, peak_rss_mb=mem.mb, run_id=ctx.run_id)
    rows = sum(r.rows for r in refs.values())
    store.event(ctx.run_id, stage, fp, ctx.dataset, "computed", rows=rows, rows_computed=rows_computed,
                seconds=seconds, peak_rss_mb=mem.mb)
    log.info("%-14s computed  [%s] %s (%d new) in %.2f s, peak %.0f MB",
             stage, fp, rows_text(refs), rows_computed, seconds, mem.mb)
    return refs


def rows_text(refs: Mapping[str, ArtifactRef]) -> str:
    """``300 rows``; a stage writing several tables gives each one's rows (``rows: documents 300, gold 135``),
    never their sum."""
    if len(refs) == 1:
        return f"{next(iter(refs.values())).rows} rows"
    return "rows: " + ", ".join(f"{name} {ref.rows}" for name, ref in refs.items())


def _write_outputs(store: Store, dataset: str, stage: str, fp: str, outputs: Mapping[str, Output],
                   ext: Mapping[str, str]) -> dict[str, ArtifactRef]:
    refs = {}
    for name, value in outputs.items():
        path = store.path_for(dataset, stage, name, fp, ext.get(name, "parquet"))
        if isinstance(value, bytes):
            write_bytes(value, path)
            rows = 1
        elif isinstance(value, TableStream):
            rows = write_parquet_stream(value, path)
        else:
            rows = write_parquet(value, path)
        refs[name] = ArtifactRef(name, str(path), fp, rows)
    return refs


def run_named_row_stage(ctx: RunContext, stage: str, code: str, params: Any, row_params: Any,
                        inputs: Mapping[str, str], keys: Callable[[], pd.Series] | pd.Series,
                        compute_rows: Callable[[list[str]], pa.Table | pd.DataFrame],
                        key: str, assemble: Callable[[Any], Mapping[str, Output]], stream: bool = False,
                        max_partition_rows: int = 0) -> dict[str, ArtifactRef]:
    """A per-row stage: compute rows only for keys missing from the row cache, then assemble outputs.

    ``row_params`` is what changes a row's value: the params that matter (a model name, not a batch
    size) and the code version of the functions computing a row (not of the whole module, so an
    edit elsewhere in it keeps the cache): it names the row cache. ``keys()`` gives the content keys of the current
    input rows, called only when the stage computes (or a plan counts its new rows): a cached stage, or an index
    opened for questions, neither reads its input nor hashes a text. ``compute_rows(missing_keys)`` returns
    rows (with a ``key`` column) for exactly those; ``assemble(cached_rows_for_all_keys)`` builds the
    stage outputs for this input (in input order).

    With ``stream``, ``assemble`` gets instead a function that yields the cached rows one row-cache part at a time
    (or None when there are no keys), for outputs written as they come (:class:`tasks.core.files.TableStream`):
    the stage never holds all its rows. The parts are read through once first, so a damaged one is dropped and
    its rows computed again, as without ``stream``. ``max_partition_rows`` (0: none) caps the runner's partitions
    for a stage whose rows are large (a document's whole text), so that one partition stays small.
    """
    store = ctx.store
    param_fp = short_hash({"stage": stage, "params": params_dict(row_params)})
    if not callable(keys):  # the keys themselves, already read (the stage pays for the read either way)
        keys = functools.partial(lambda given: given, keys)

    def compute() -> tuple[Mapping[str, Output], int]:
        wanted = list(dict.fromkeys(keys().tolist()))
        cache = store.row_cache(stage, param_fp, key)
        computed = 0
        for attempt in (1, 2):  # a part found damaged when read whole is dropped: its rows are computed again
            missing = cache.missing(wanted)
            computed += len(missing)
            for part in compute_partitions(stage, compute_rows, missing, max_partition_rows):
                cache.append(part)  # in the flow process only: workers return rows, they write nothing
            try:
                if stream:
                    for _ in cache.read_parts(wanted) if wanted else ():
                        pass  # checked part by part, nothing kept
                    rows = functools.partial(cache.read_parts, wanted) if wanted else None
                else:
                    rows = cache.read(wanted) if wanted else None
                break
            except DamagedFile:
                if attempt == 2:
                    raise
        return assemble(rows), computed

    def new_rows(store: Store) -> tuple[int, int]:
        wanted = list(dict.fromkeys(keys().tolist()))
        return len(store.row_cache(stage, param_fp, key).missing(wanted)), len(wanted)

    return run_named_stage(ctx, stage, code, params, {**inputs, "_rows": param_fp}, compute, new_rows=new_rows)


def partition_plan(n_rows: int, partition_rows: int) -> list[tuple[int, int]]:
    """Row ranges ``[start, end)`` of at most ``partition_rows`` rows covering ``n_rows`` (0: one range)."""
    if n_rows == 0:
        return []
    size = partition_rows if partition_rows > 0 else n_rows
    return [(a, min(a + size, n_rows)) for a in range(0, n_rows, size)]


def _partition_runner() -> Any:
    """The flow's task runner when it partitions per-row stages (``flows.runtime.runners``), else None."""
    try:
        from prefect.context import FlowRunContext
    except ImportError:
        return None
    flow_ctx = FlowRunContext.get()
    runner = getattr(flow_ctx, "task_runner", None)
    return runner if hasattr(runner, "partition_rows") else None


def compute_partitions(stage: str, compute_rows: Callable[[list[str]], Any], missing: list[str],
                       max_rows: int = 0) -> Iterator[Any]:
    """The rows of ``missing`` keys, computed one partition (a row range) at a time, yielded in order.

    The flow's task runner decides where: ``runner=thread`` in this process, ``runner=dask`` on Dask
    workers (all partitions submitted at once). Either way the same ranges are computed by the same code,
    so the rows are the same, and each partition's rows come back here, where the caller appends them to
    the row cache: a killed run keeps the partitions it finished. Progress goes to the log and, with more
    than one partition, to a Prefect progress artifact. ``max_rows`` (0: none) caps the runner's partition size.
    """
    runner = _partition_runner()
    size = runner.partition_rows if runner is not None else 0
    plan = partition_plan(len(missing), min(s for s in (size, max_rows) if s) if size or max_rows else 0)
    if not plan:
        return
    progress = _Progress(stage, len(plan), len(missing))
    submit = getattr(runner, "submit_partition", None)
    if submit is None:
        for a, b in plan:
            rows = compute_rows(missing[a:b])
            progress.step(b - a)
            yield rows
        return
    futures = [submit(compute_rows, missing[a:b], f"{stage} rows {a}-{b - 1} of {len(missing)}")
               for a, b in plan]
    try:
        for (a, b), future in zip(plan, futures):
            rows = future.result()
            progress.step(b - a)
            yield rows
    finally:  # a failed partition (or a stopped run) leaves no work queued on the cluster
        for future in futures:
            if not future.done():
                future.cancel()


class _Progress:
    """Log lines, and a Prefect progress artifact when a stage has several partitions."""

    def __init__(self, stage: str, parts: int, rows: int) -> None:
        self.stage, self.parts, self.rows, self.done_parts, self.done_rows = stage, parts, rows, 0, 0
        self.artifact = None
        if parts > 1:
            try:
                from prefect.artifacts import create_progress_artifact

                self.artifact = create_progress_artifact(0.0, description=f"{stage}: {parts} partitions, {rows} rows")
            except Exception:  # noqa: BLE001 - no API or no flow run: the log line is enough
                self.artifact = None

    def step(self, rows: int) -> None:
        self.done_parts += 1
        self.done_rows += rows
        if self.parts > 1:
            log.info("%-14s partition %d/%d done, %d/%d rows", self.stage, self.done_parts, self.parts,
                     self.done_rows, self.rows)
        if self.artifact is not None:
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(self.artifact, 100.0 * self.done_rows / self.rows)
            except Exception:  # noqa: BLE001
                self.artifact = None
