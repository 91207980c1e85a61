"""``Loader``: the DataLoader a fastdata dataset needs, which can stop mid-epoch and resume exactly.

It builds the ``torch.utils.data.DataLoader`` with :func:`fastdata.loading.build_dataloader` (an
iterable dataset batches itself, so ``batch_size=None``; a map-style one is read through its rank-aware
``.sampler()``, or through a resumable batch sampler such as ``HDF5Dataset.chunk_sampler()``), sets the
epoch, counts the batches handed out, and saves that count as a :class:`~fastdata.core.epoch.ResumeState`.

Why a count of batches is enough: for both kinds the rank's sequence of batches depends only on
(seed, epoch, rank, world size, batch size), never on ``num_workers`` (see :mod:`fastdata.core.epoch`), and
the DataLoader hands batches out in that order. So ``(epoch, batches consumed)`` names the exact point to
resume from, in a new process, with any number of workers. The state is the same on every rank (all
ranks consume the same number of batches per step), so saving rank 0's is enough.

A state saved on another number of ranks, or with another batch size, resumes too: the samples of that
epoch no rank had consumed are read exactly once across this run's ranks, the same number of batches on
each (:mod:`fastdata.core.epoch`; map-style: :mod:`fastdata.loading`); the epochs after it are read
as a run of this size reads them.

Who reads: worker processes (``num_workers``; batches handed over through reused shared-memory slots by
default, ``transport="slots"``, see :mod:`fastdata.loading.transport`; ``threads_per_worker`` threads in
each, :mod:`fastdata.loading.threads`), or ``workers="threads"``: threads of this process, each standing
for one worker (:mod:`fastdata.loading.threads`). The batches, their order and the resume state are
the same in every mode, so a state saved in one resumes in another.

We write this small wrapper because ``torchdata``'s ``StatefulDataLoader`` (which fastdata's datasets
and samplers also work with) keeps one state per worker and refuses a different ``num_workers`` on resume.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from torch.utils.data import DataLoader, IterableDataset

from fastdata.core.epoch import REMAINDERS, Remainder, ResumeState, Stop, WorkerInit, load_state, next_layout, rank_span
from fastdata.core.errors import ConfigError, PlanError, check_positive
from fastdata.loading import transport as slots
from fastdata.loading._builder import Transport, build_dataloader, fastdata_worker_init
from fastdata.loading._checks import (
    Workers,
    check_batch_sampler,
    check_iterable,
    check_mode,
    check_plain_iterable,
    make_sampler,
)
from fastdata.loading._plain import PlainView, is_plain, reads_as_is
from fastdata.loading._plan import ReadPlan
from fastdata.loading._protocol import Dataset, Planned, RankSampler
from fastdata.loading._tail import ElasticDataset, TailBatches, check_elastic, tail_batches
from fastdata.loading._warnings import WarningRelay
from fastdata.loading.observe._session import Session, loader_session
from fastdata.loading.observe.report import Since, Stats
from fastdata.loading.observe.tune import AutoTune, Setting
from fastdata.loading.threads._loader import ThreadLoader, thread_loader_for

DEFAULT_TRANSPORT: Transport = "slots"
"""The transport ``fd.Loader`` uses with worker processes unless told otherwise (see docs/performance.md
for the measurements behind it)."""

# DataLoader options the Loader decides itself, and why a user may not pass them.
_OWNED = {
    "shuffle": "pass shuffle= to Loader (map-style) or to the dataset (iterable)",
}


class Loader:
    """Iterate a fastdata dataset through a ``DataLoader``, and resume mid-epoch from a saved state.

    Example::

        loader = fd.Loader(ds, batch_size=64, num_workers=4)
        if checkpoint:
            loader.load_state_dict(checkpoint["loader"])
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                ...
                checkpoint = {"loader": loader.state_dict(), ...}

    Args:
        dataset: a fastdata dataset (:class:`fastdata.loading.Dataset`), or your own torch dataset. Iterable
            fastdata ones (``TarShardDataset``) must be built with ``batch_size``; map-style ones need a
            ``sampler()`` method (all fastdata map-style datasets) or ``sampler=``/``batch_sampler=``. Your own
            map-style dataset (``__getitem__`` and ``__len__``) is read through an
            :class:`~fastdata.loading.EpochSampler` over its indices (shuffled per epoch from seed 0, or the
            dataset's ``seed`` attribute; split over ranks; resumable at any batch). Your own
            ``IterableDataset`` is read as is: its order, shuffling and split over workers
            (``get_worker_info()``) and ranks are its own, ``state_dict()`` raises ``ConfigError``, and
            ``num_workers="auto"`` changes the workers between passes only. Either gets its ``set_epoch`` and
            ``close`` called where it has them.
        batch_size (int | None): samples per batch. Required for map-style datasets (unless
            ``batch_sampler`` is given); for iterable fastdata ones it defaults to the dataset's and must equal
            it; for your own iterable one, None hands its items out as it yields them.
        num_workers (int | "auto"): DataLoader worker processes, or threads with ``workers="threads"``.
            ``"auto"`` (worker processes only) starts from as many as the cores and memory allow, measures, and
            moves them (and, with ``prefetch_factor="auto"``, the prefetch) at batch boundaries, restarting the
            workers with the epoch continuing exactly (see :mod:`fastdata.loading.observe.tune` and
            docs/monitor.md). Defaults to 0 (read in the training process).
        workers ("processes" | "threads"): who reads (:data:`Workers`): worker processes, or threads of
            this process, for work that releases the GIL (file and S3 reads, PIL/OpenCV/PyAV decode). The
            batches, their order and resuming are the same either way. Defaults to "processes".
        threads_per_worker (int): with worker processes: threads in each that fetch and decode (the
            hybrid, :mod:`fastdata.loading.threads`). Defaults to 1.
        transport ("slots" | "stock" | None): how worker processes hand batches over
            (:data:`~fastdata.loading.Transport`): reused shared-memory slots, or the DataLoader's
            own way. Defaults to None: :data:`DEFAULT_TRANSPORT`.
        shuffle (bool | None): map-style only: a new order every epoch. Defaults to True. For an iterable
            dataset, set it on the dataset (it must agree if given here).
        remainder ("drop" | "pad" | "uneven" | None): how an epoch that does not split evenly over ranks
            is handled, see :data:`fastdata.core.epoch.Remainder`. Map-style: passed to ``sampler()``,
            defaults to "drop". Iterable: set it on the dataset (it must agree if given here).
        drop_last (bool | None): drop the rank's last, smaller batch. Map-style: defaults to False.
            Iterable: set it on the dataset (it must agree if given here).
        sampler: map-style only: a sampler with ``set_epoch``, ``state_dict`` and ``load_state_dict``
            (an :class:`~fastdata.loading.EpochSampler`) to use instead of ``dataset.sampler()``.
        batch_sampler: map-style only: a resumable sampler of whole batches,
            ``HDF5Dataset.chunk_sampler(batch_size, ...)`` (a
            :class:`~fastdata.loading.ChunkBatchSampler`); it sets the batch size, the order
            and ``drop_last``.
        worker_init_fn (Callable | None): run in each worker process after :data:`fastdata.worker_init_fn`,
            which the Loader always installs. Not with threads. Defaults to None.
        monitor (bool | Callable | str | PathLike | Monitor | None): report while training
            (:class:`~fastdata.loading.observe.report.Stats`, every 10 s by default): True, a log line (logger
            ``fastdata.monitor``); a function, called with each report; a path, a JSON-lines file; or an
            :class:`~fastdata.loading.observe.report.Monitor`. :meth:`stats` returns the latest. Defaults to None.
        autotune (AutoTune | None): how ``"auto"`` moves (bounds, window, interval, margin). Defaults to None:
            ``AutoTune()``.
        **dataloader_kwargs: passed to ``DataLoader`` (``pin_memory``, ``persistent_workers``,
            ``prefetch_factor`` (a count, or ``"auto"`` with worker processes), ``multiprocessing_context``,
            ``timeout``, ``collate_fn`` for map-style ...).
            ``in_order=False`` is refused: batches out of order cannot be resumed exactly. With threads,
            ``pin_memory``, ``prefetch_factor`` and ``collate_fn`` apply; the options of processes are refused.

    Raises:
        ConfigError: for a combination that cannot resume exactly, at construction.
        PlanError: when a rank would get no batch at all (``drop_last`` with fewer samples than a batch).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None = None,
        num_workers: int | Literal["auto"] = 0,
        shuffle: bool | None = None,
        remainder: Remainder | None = None,
        drop_last: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        worker_init_fn: Any = None,
        workers: Workers = "processes",
        threads_per_worker: int = 1,
        transport: Transport | None = None,
        monitor: Any = None,
        autotune: AutoTune | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        requested = check_mode(workers, num_workers, threads_per_worker, transport, worker_init_fn, dataloader_kwargs)
        self.workers: Workers = workers
        self.threads_per_worker = threads_per_worker
        self.transport: Transport = transport or DEFAULT_TRANSPORT
        for name, why in _OWNED.items():
            if name in dataloader_kwargs:
                raise ConfigError(f"Loader sets the DataLoader's {name} itself: {why}")
        if dataloader_kwargs.get("in_order", True) is False:
            raise ConfigError(
                "in_order=False hands batches out as workers finish them, so a count of consumed "
                "batches no longer names a point to resume from; leave in_order at True"
            )
        self.dataset: Any = dataset  # what the DataLoader reads: the user's own object, whatever its kind
        # what the Loader asks of it (epoch, rank, seed, close ...): the dataset itself when it is a fastdata one
        # (a Dataset, and a MapDataset or a BatchingDataset, checked below), else a PlainView over it
        self._plain: PlainView | None = None
        if not isinstance(dataset, Dataset):
            if not is_plain(dataset):
                raise ConfigError(
                    f"Loader reads a torch dataset: a map-style one (torch.utils.data.Dataset with __getitem__ and "
                    f"__len__), an IterableDataset, or a fastdata dataset (fastdata.loading.Dataset); not "
                    f"{type(dataset).__name__}"
                )
            self._plain = PlainView(dataset)
        elif reads_as_is(dataset):  # streamed: no length and no position, so read as is, like a plain iterable
            self._plain = PlainView(dataset)
            own = getattr(dataset, "batch_size", None)
            if batch_size is not None and own is not None:
                raise ConfigError(
                    f"batch_size={batch_size} with {type(dataset).__name__}(batch_size={own}): "
                    "the dataset batches itself; pass one or the other"
                )
        self._ds: Any = self._plain if self._plain is not None else dataset
        # --- monitor and autotune (fastdata.loading.observe._session): the session (None without either) and the
        # user's DataLoader options; self._kwargs (below) are the current setting's: those, the probes'
        # hooks and the prefetch ---
        self._session: Session | None
        self._session, self._user_kwargs = loader_session(
            requested,
            monitor,
            autotune,
            dataloader_kwargs,
            threads=workers == "threads",
            counters=getattr(dataset, "_shared", None),  # its skipped count, kept right across auto's restarts
        )
        session = self._session
        self.num_workers = session.setting.workers if session and session.tuner else requested.workers or 0
        self.iterable = isinstance(dataset, IterableDataset)
        # the sampler the Loader resumes through (map-style), and whether it hands out whole batches; for an
        # iterable dataset, only what a framework calls at each epoch (Lightning: loader.sampler.set_epoch)
        self.sampler: Any = None
        self._batch_sampler = False
        self.batch_size: int
        if self.iterable and self._plain is not None:
            self.sampler = LoaderEpoch(self)
            # None (items handed out as the dataset yields them) only here, where no resume state counts samples
            self.batch_size = check_plain_iterable(  # type: ignore[assignment]
                dataset, batch_size, shuffle, remainder, sampler, batch_sampler, workers, num_workers
            )
        elif self.iterable:
            self.sampler = LoaderEpoch(self)
            if batch_sampler is not None:
                raise ConfigError(f"{type(dataset).__name__} is iterable and batches itself: pass no batch_sampler")
            self.batch_size = check_iterable(
                dataset, batch_size, shuffle, remainder, drop_last, sampler, dataloader_kwargs
            )
        elif batch_sampler is not None:
            self.batch_size = check_batch_sampler(batch_sampler, batch_size, shuffle, remainder, drop_last, sampler)
            self.sampler, self._batch_sampler = batch_sampler, True
        else:
            if batch_size is None:
                raise ConfigError("Loader needs batch_size= for a map-style dataset (or a batch_sampler=)")
            check_positive("batch_size", batch_size)
            self.batch_size = batch_size
            self.sampler = make_sampler(self._ds, sampler, shuffle, remainder)
            unit = getattr(self.sampler, "unit", 1)
            if unit > 1 and batch_size != unit:  # a Mix's per-source batches
                raise ConfigError(
                    f"{type(dataset).__name__}'s sampler lays out its indices in runs of {unit} that each make one "
                    f"batch: pass batch_size={unit}"
                )
        self._drop_last = bool(drop_last)
        self._collate_fn = self._user_kwargs.pop("collate_fn", None)  # part of the read plan
        self._worker_init = fastdata_worker_init(worker_init_fn)
        self._live: weakref.ref[Any] | None = None  # the current pass's DataLoader iterator (see _drop_dataloader)
        self._relay: WarningRelay | None = None  # the workers' warnings, carried here (made with the first workers)
        self._kwargs = self._user_kwargs
        if self._session is not None:
            self._kwargs = self._session.kwargs_for(self._user_kwargs, self._session.setting)
        self._dataloader: DataLoader[Any] | None = None
        self._threads: ThreadLoader | None = None
        self._built_for: TailBatches | None = None  # the tail the DataLoader or threads were built for
        # an epoch resumed from another number of ranks or batch size: (epoch, history, batches), see _tail_for
        self._tail: tuple[int, tuple[Stop, ...], Any] | None = None
        self._pending: tuple[int, int] | None = None  # (epoch, batches) loaded and not yet iterated
        self._position: tuple[int, int] = (self.epoch, 0)  # (epoch, batches handed out of it)
        self._finished: int | None = None  # the epoch a pass read to its end, until the epoch is set again
        self._tail_offset = 0  # what len() and consumed add to a resumed epoch's tail (see load_state_dict)
        if self._length() == 0 or self._starves_a_rank():
            raise PlanError(
                f"a rank reads fewer samples per epoch than batch_size={self.batch_size}, so "
                "drop_last=True leaves it no batch; use a smaller batch_size, fewer ranks, or "
                "drop_last=False"
            )

    def _starves_a_rank(self) -> bool:
        """Whether ``drop_last`` leaves the rank that reads the fewest samples (the last one, under
        ``remainder="uneven"``) without a batch: judged alike on every rank, so all of them refuse it."""
        sampler = self.sampler
        drop_last = sampler.drop_last if self._batch_sampler else self._drop_last
        if self.iterable or not drop_last or not isinstance(sampler, RankSampler):
            return False
        ws = sampler.world_size
        return rank_span(sampler.n, ws - 1, ws, sampler.remainder)[1] < self.batch_size

    def _read_plan(self) -> ReadPlan:
        """How the dataset is read: what ``build_dataloader`` and ``ThreadLoader`` both take."""
        if self.iterable and self._plain is not None:  # read as is, batched by the DataLoader
            return ReadPlan(self.batch_size, drop_last=self._drop_last, collate_fn=self._collate_fn)
        if self.iterable:
            return ReadPlan(collate_fn=self._collate_fn)
        tail = self._active_tail()
        if tail is not None:  # a resumed epoch's tail: its batches listed, of unequal sizes
            return ReadPlan(batch_sampler=tail, collate_fn=self._collate_fn)
        if self._batch_sampler:
            return ReadPlan(batch_sampler=self.sampler, collate_fn=self._collate_fn)
        return ReadPlan(self.batch_size, self.sampler, drop_last=self._drop_last, collate_fn=self._collate_fn)

    @property
    def dataloader(self) -> DataLoader[Any]:
        """The ``torch.utils.data.DataLoader`` underneath (built on first use), with worker processes.

        Raises:
            ConfigError: with ``workers="threads"``, which reads through :attr:`thread_loader` instead.
        """
        if self.workers == "threads":
            raise ConfigError(
                'workers="threads" reads through a ThreadLoader, not a DataLoader: see Loader.thread_loader'
            )
        self._follow_tail()
        if self._dataloader is None:
            init = self._worker_init
            if self.num_workers:
                if self._relay is None:
                    self._relay = WarningRelay(self._kwargs.get("multiprocessing_context"))
                # first of all: what seeding and warming the dataset and the user's function warn is carried too
                init = WorkerInit(*init.then, before=(self._relay.install, *init.before))
            self._dataloader = build_dataloader(
                self.dataset,
                self._read_plan(),
                num_workers=self.num_workers,
                worker_init_fn=init,
                transport=self.transport,
                threads_per_worker=self.threads_per_worker,
                **self._kwargs,
            )
        return self._dataloader

    @property
    def thread_loader(self) -> ThreadLoader:
        """With ``workers="threads"``: the :class:`~fastdata.loading.threads.ThreadLoader` underneath.

        Raises:
            ConfigError: with worker processes, which read through :attr:`dataloader`.
        """
        if self.workers != "threads":
            raise ConfigError("this Loader reads through worker processes: see Loader.dataloader")
        self._follow_tail()
        if self._threads is None:
            self._threads = thread_loader_for(self.dataset, self.num_workers, self._read_plan(), **self._kwargs)
        return self._threads

    def _source(self) -> Any:
        return self.thread_loader if self.workers == "threads" else self.dataloader

    @property
    def epoch(self) -> int:
        """The current epoch (shared with the dataset and its sampler)."""
        return int(self._ds.epoch)

    @property
    def consumed(self) -> int:
        """Batches of the current epoch handed out so far (or loaded by :meth:`load_state_dict`); in an epoch
        resumed from another number of ranks, ``len(loader) - consumed`` is what is left of its tail."""
        return self._batches_done() + (self._tail_offset if self._in_tail() else 0)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order on every rank. Keeps a loaded state if it is for ``epoch``.

        Without it, each pass read to its end moves the next one to the following epoch (a new order), as a
        framework's loop that calls nothing expects; frameworks that call ``loader.sampler.set_epoch``
        (Lightning) reach this method."""
        self._finished = None
        self._ds.set_epoch(epoch)
        if self.sampler is not None and not self.iterable:
            self.sampler.set_epoch(epoch)
        if self._pending is not None and self._pending[0] != epoch:
            self._pending = None
        if self._tail is not None and self._tail[0] != epoch:
            self._tail = None  # a resumed epoch's tail is over: the next epochs are this run's own
            self._tail_offset = 0

    def __len__(self) -> int:
        """Batches per epoch on this rank: the same on every rank, unless ``remainder="uneven"``.

        In an epoch resumed from another number of ranks, as after any resume, ``len(loader) - consumed``
        batches are left (the tail's, the same on every rank), and ``len(loader)`` is at least this run's whole
        epoch and at least the saved position plus the tail: a loop that counts its batches from the saved
        position and stops at ``len(loader)`` or at the loader's end (Lightning's) reads the whole tail, and
        every later epoch whole."""
        if self._in_tail():
            return self._tail_offset + self._epoch_batches()
        return self._epoch_batches()

    def _in_tail(self) -> bool:
        return self._tail is not None and self._tail[0] == self.epoch

    def _epoch_batches(self) -> int:
        """Batches of this rank's pass over the current epoch: the tail's, in an epoch resumed elsewhere."""
        tail = self._tail
        if tail is not None and tail[0] == self.epoch:
            return tail[2] if self.iterable else len(tail[2])  # type: ignore[no-any-return]
        if self._plain is not None and self.iterable:
            n = self._plain.batches(self.batch_size, self._drop_last)
            if n is None:
                raise TypeError(f"{self._plain.name} has no len(), so neither has a Loader over it")
            return n
        return len(self.dataset) if self.iterable else len(self._source())

    def _length(self) -> int | None:
        """``len(self)``, or None for an iterable dataset without ``len()``."""
        try:
            return len(self)
        except TypeError:
            if self._plain is None:
                raise
            return None

    # --- an epoch resumed on another number of ranks, or with another batch size (fastdata.core.epoch._elastic) ---

    def _active_tail(self) -> TailBatches | None:
        """The batch sampler of the current epoch's tail (map-style), or None."""
        tail = self._tail
        if tail is None or tail[0] != self.epoch or self.iterable:
            return None
        batches: TailBatches = tail[2]
        return batches

    def _follow_tail(self) -> None:
        """Drop a DataLoader (or threads) built for another tail, or for none, than the current epoch's."""
        if self.iterable or self._built_for is self._active_tail():
            return
        self._drop_dataloader()
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        self._built_for = self._active_tail()

    def _tail_for(self, epoch: int, history: tuple[Stop, ...]) -> Any:
        """What a pass over epoch ``epoch`` read after the stops of ``history`` needs: the tail's batch count
        (iterable: the dataset plans its batches in each worker), or its :class:`TailBatches` (map-style)."""
        check_elastic(self._ds, self.sampler, self.iterable)
        if self.iterable:
            assert isinstance(self.dataset, ElasticDataset)
            return self.dataset.elastic_length(history)
        drop_last = False if self._batch_sampler else self._drop_last
        return TailBatches(
            epoch, history, tail_batches(self.sampler, history, batch_size=self.batch_size, drop_last=drop_last)
        )

    # --- end of the resumed epoch's tail ---

    def __iter__(self) -> Iterator[Any]:
        if self._finished is not None and self._finished == self.epoch and self._pending is None:
            self.set_epoch(self.epoch + 1)  # nobody set the epoch since the last pass ended: count it ourselves
        epoch = self.epoch
        start = 0
        if self._pending is not None and self._pending[0] == epoch:
            start = self._pending[1]
        self._pending = None
        if self._session is not None:  # --- monitor and autotune: a change waiting for this pass ---
            change = self._session.pass_starts(epoch)
            if change is not None:
                self._configure(change.after)
        return self._count(self._open(epoch, start), epoch, start)

    def _open(self, epoch: int, start: int) -> Iterator[Any]:
        """The DataLoader's (or threads') iterator over epoch ``epoch``, after its first ``start`` batches."""
        tail = self._tail if self._tail is not None and self._tail[0] == epoch else None
        if self.iterable and self._plain is not None:
            self._plain.set_epoch(epoch)  # read as is, from its start (the Loader keeps no position in it)
        elif self.iterable:
            history = tail[1] if tail is not None else ()
            own = self._plan()  # the dataset's own plan (and this Loader's, the same for an iterable dataset)
            self.dataset.load_state_dict(ResumeState(epoch, start, "batches", own, history=history).to_dict())
        elif tail is not None:
            self._ds.set_epoch(epoch)
            tail[2].start = start
        else:
            # set for every pass, so that the dataset knows the pass is this epoch's (its workers seed their
            # streams from it: see fastdata.core.epoch._seeding), whatever sampler the Loader reads through
            self._ds.set_epoch(epoch)
            # the sampler counts samples; the last batch may be short: k batches are at most the whole epoch
            samples = self.sampler.samples if self._batch_sampler else len(self.sampler)
            consumed = min(start * self.batch_size, samples)
            theirs = ResumeState.from_dict(self.sampler.state_dict()).plan  # the sampler's own plan: it fits
            self.sampler.load_state_dict(ResumeState(epoch, consumed, "samples", theirs).to_dict())
        self._position = (epoch, start)
        with self._session.opening() if self._session is not None else contextlib.nullcontext():
            batches = iter(self._source())  # auto past the cores for waiting workers: torch's warning silenced
        self._live = weakref.ref(batches) if hasattr(batches, "_shutdown_workers") else None  # not kept alive
        if self.iterable and self._plain is None:
            # the workers (or threads) took their copy of the resume position when the iterator started
            # them (the main process, without workers, when it took the iterator); ours must not apply to a
            # later pass
            self.dataset.load_state_dict(ResumeState(epoch, 0, "batches").to_dict())
        return batches

    def _count(self, batches: Iterator[Any], epoch: int, start: int) -> Iterator[Any]:
        done = start
        if self._session is not None:  # --- monitor and autotune: count, report, restart where told ---
            # a plain iterable dataset cannot be continued mid-pass: auto's changes wait for the next pass
            restarts = self._session.tuner is not None and not (self.iterable and self._plain is not None)
            reopen = self._reopen if restarts else None
            batches = self._session.run(batches, epoch, start, self._length(), reopen)
        relay = self._relay
        for batch in batches:
            done += 1
            self._position = (epoch, done)  # before the yield: a state saved while training on it counts it
            if relay is not None:
                relay.drain()  # the workers' warnings so far, issued here (a poll of an empty pipe: ~1 us)
            yield batch
        if relay is not None:
            relay.drain()
        if self.epoch == epoch:
            self._finished = epoch

    # --- monitor and autotune (fastdata.loading.observe._session) ---

    def _configure(self, setting: Setting) -> None:
        """Build the next DataLoader with ``setting`` (the autotuner's); the old one's workers have stopped
        (or stop as it is dropped), so their slots are let go of at once."""
        assert self._session is not None
        self.num_workers = setting.workers
        self._kwargs = self._session.kwargs_for(self._user_kwargs, setting)
        self._drop_dataloader()

    def _reopen(self, epoch: int, done: int, setting: Setting) -> Iterator[Any]:
        """A new DataLoader with ``setting``, continuing epoch ``epoch`` after ``done`` batches (the old
        one's iterator was shut down): the resume a saved state gets, mid-pass."""
        self._configure(setting)
        return self._open(epoch, done)

    def stats(self, since: Since = "report") -> Stats | None:
        """A report of the monitor (:class:`~fastdata.loading.observe.Stats`) made now, over what was seen
        since the last periodic report (``since="report"``, the default), the current epoch's start
        (``"epoch"``) or the loader's (``"start"``). None without ``monitor=`` or ``num_workers="auto"``, or
        before the first batch."""
        return self._session.stats(since) if self._session is not None else None

    @property
    def changes(self) -> list[Any]:
        """The changes ``num_workers="auto"`` made, oldest first (:class:`~fastdata.loading.observe.Change`)."""
        return self._session.changes if self._session is not None else []

    # --- end of monitor and autotune ---

    def _batches_done(self) -> int:
        epoch = self.epoch
        if self._pending is not None and self._pending[0] == epoch:
            return self._pending[1]
        if self._position[0] == epoch:
            return self._position[1]
        return 0

    def _plan(self) -> dict[str, int]:
        """What this rank's batches depend on, besides the epoch: a state saved under another plan
        names other samples."""
        ds = self._ds
        plan = {
            "batch_size": self.batch_size,
            "world_size": int(ds.world_size),
            "size": int(ds.total if self.iterable else len(ds)),
            "seed": int(ds.seed),
        }
        if isinstance(ds, Planned):  # its data (shards, files, a Mix's sources); an iterable one: its whole plan
            plan = {**ds.resume_plan(), **plan}
        if self.sampler is not None and not self.iterable:  # what else its batches depend on (shuffle, a mix ...)
            plan = {**ResumeState.from_dict(self.sampler.state_dict()).plan, **plan}
        # the split over ranks: an epoch finished on another number of ranks replays it (fastdata.core.epoch._elastic)
        remainder = getattr(ds if self.iterable else self.sampler, "remainder", None)
        if remainder in REMAINDERS:
            plan["remainder"] = REMAINDERS.index(remainder)
        drop_last = (
            ds.drop_last if self.iterable else (self.sampler.drop_last if self._batch_sampler else self._drop_last)
        )
        plan["drop_last"] = int(bool(drop_last))
        return plan

    def state_dict(self) -> dict[str, Any]:
        """Where to resume: a :class:`~fastdata.core.epoch.ResumeState` (as a dict) counting the batches of
        the current epoch handed out, with the plan they were consumed under.

        The batch count is the batches handed out by this Loader in the current epoch, so save the state
        after the training step of the last batch. It is the same on every rank (except near the end of an
        epoch with ``remainder="uneven"``, where each rank should keep its own).
        """
        if self.iterable and self._plain is not None:
            raise self._plain.refuse_resume()
        tail = self._tail
        history = tail[1] if tail is not None and tail[0] == self.epoch else ()
        return ResumeState(self.epoch, self._batches_done(), "batches", self._plan(), history=history).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass over the state's epoch start after its batches.

        Sets the epoch to the state's. Any ``num_workers`` works. Restarts persistent workers.

        A state saved on another number of ranks or with another batch size (this run's ``world_size`` and
        ``batch_size`` differ from its plan's) finishes its epoch here: the samples of that epoch no rank had
        consumed are read exactly once across this run's ranks, in the same number of batches on each (see
        :mod:`fastdata.core.epoch` for the order, and the one case where a sample is read twice). Load
        the same state on every rank.

        The state must have been saved under this Loader's plan (what its order and split depend on: the
        data, seed, shuffle, shuffle window, remainder, ``drop_last``, a Mix's sources and shares; see
        :class:`fastdata.core.ResumeState`); ``num_workers``, the transport and threads may differ. A state of
        an older fastdata (``version`` 1) is refused: it does not record all of these, so start its epoch
        again with :meth:`set_epoch`.

        Raises:
            ConfigError: when the state was saved under another plan (naming every setting that differs, with
                both values: it would name other samples), lies outside the epoch, is not a state fastdata
                saved (a field of the wrong type or out of range, named), or was saved on another number of
                ranks for a sampler or dataset that cannot finish an epoch elsewhere.
        """
        if self.iterable and self._plain is not None:
            raise self._plain.refuse_resume()
        earlier, self._tail = self._tail, None  # the length checked is the epoch's own, not an earlier tail's
        try:
            s = load_state(state, into="Loader", unit="batches", plan=self._plan(), length=len(self), elastic=True)
        except ConfigError:
            self._tail = earlier
            raise
        history, position = next_layout(s, int(self._ds.world_size), self.batch_size)
        self.close()  # persistent workers hold a copy of the dataset from before this state
        self.set_epoch(s.epoch)
        whole = self._epoch_batches()  # this run's whole epoch (no tail set yet)
        self._tail_offset = 0
        if history:
            try:
                self._tail = (s.epoch, history, self._tail_for(s.epoch, history))
            except PlanError as e:  # a layout no run of this dataset could have read: not a state it saved
                raise ConfigError(f"this state names a layout this dataset cannot be read in: {e}") from None
            tail = self._epoch_batches()
            if position > tail:
                raise ConfigError(f"batches={position} is outside this rank's resumed epoch of {tail} batches")
            # len() and consumed as after a same-size resume (see __len__)
            self._tail_offset = max(whole, s.position + tail) - tail
        self._pending = (s.epoch, position)

    def close(self) -> None:
        """Stop the workers (persistent ones too) or threads, let go of the slots of exited workers, and
        close the dataset's handles. Idempotent; the Loader can be iterated again afterwards."""
        self._drop_dataloader()
        if self._threads is not None:
            self._threads.close()  # each thread closes its dataset copy
            self._threads = None
        if self._session is not None:
            self._session.close()
        self._ds.close()

    def _drop_dataloader(self) -> None:
        # the pass's iterator, shut down now: left to the garbage collector (an error's traceback keeps it, in
        # a reference cycle), its workers were told to stop only after their queues were gone, and each
        # was killed after torch's 5 s wait
        live, self._live = (self._live() if self._live is not None else None), None
        shutdown = getattr(live, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if self._dataloader is not None:
            self._dataloader = None  # the DataLoader's iterator shuts its workers down when it is dropped
            slots.release()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "iterable" if self.iterable else "map-style"
        if self.workers == "threads":
            mode = ", workers='threads'"
        else:
            mode = f", threads_per_worker={self.threads_per_worker}" if self.threads_per_worker > 1 else ""
            mode += f", transport={self.transport!r}" if self.num_workers else ""
        auto = " (auto)" if self._session is not None and self._session.tuner is not None else ""
        return (
            f"Loader({type(self.dataset).__name__} ({kind}), batch_size={self.batch_size}, "
            f"num_workers={self.num_workers}{auto}{mode}, epoch={self.epoch})"
        )


class LoaderEpoch:
    """``Loader.sampler`` of an iterable dataset: what a framework calls at the start of each epoch
    (Lightning calls ``loader.sampler.set_epoch``), passed on to :meth:`Loader.set_epoch`."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._loader)

    def __repr__(self) -> str:
        return f"LoaderEpoch(epoch={self.epoch})"


__all__ = ["DEFAULT_TRANSPORT", "Loader", "LoaderEpoch"]
