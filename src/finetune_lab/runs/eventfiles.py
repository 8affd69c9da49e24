"""Strict reading of TensorBoard event files: a cut-off or corrupted file is named, not skipped.

TensorBoard's own loaders stop quietly at a truncated record (the writer may still be busy),
which is right for a live dashboard but wrong for a report. Here the file is read to its last
byte as TensorBoard's record reader reads it (``PyRecordReader_New``: both CRC-32C checksums of
every record checked), every record must parse as an ``Event``, and the first problem is
reported with the file and the byte offset of the record it is in.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from finetune_lab._files import regular_bytes
from finetune_lab.errors import UserError

try:
    import google_crc32c
except ImportError:  # the GPU machine's image lacks it: TensorBoard's CRC, in Python
    google_crc32c = None

class EventFileError(UserError):
    """An event file is truncated, corrupted or not a TensorBoard event file."""


def read_event_file_strict(path: Path | str) -> int:
    """Parse every record of a TensorBoard event file; return the number of events.

    Raises :class:`EventFileError` naming the file and the byte offset of the first problem.
    """
    return sum(1 for _ in strict_events(path))


def _crc32c() -> Any:
    """CRC-32C: google-crc32c's C code where it is installed (a locked dependency), else
    TensorBoard's own, in Python and some ten times slower (every chapter reads every run's
    event files once)."""
    if google_crc32c is not None and google_crc32c.implementation == "c":
        return google_crc32c.value
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    return crc32c


def _masked(crc: int) -> int:
    """TFRecord's masked CRC of a record's length and of its data."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``, computed by :func:`_crc32c`: TensorBoard's own
    reader, which tbparse reads through, gets this in place of its Python version
    (:func:`finetune_lab.runs.tblogs.read_with_c_crc`)."""
    return _masked(_crc32c()(bytes(data)))


def strict_events(path: Path | str) -> Iterator[Any]:
    """Every ``Event`` of a TensorBoard event file, each record checked as
    :func:`read_event_file_strict` says: TFRecord framing (an 8-byte length, its masked CRC-32C,
    the data, the data's masked CRC-32C), read from the whole file at once."""
    from tensorboard.compat.proto import event_pb2

    p = Path(path)
    data = p.read_bytes()
    size = len(data)
    if size == 0:
        raise EventFileError(f"event file {p} is empty (0 bytes)")
    crc = _crc32c()
    offset = 0
    while offset < size:
        section = ("header" if size - offset < 8 else "header crc" if size - offset < 12
                   else None)
        if section is None:
            (length,), (length_crc,) = (struct.unpack_from("<Q", data, offset),
                                        struct.unpack_from("<I", data, offset + 8))
            if _masked(crc(data[offset:offset + 8])) != length_crc:
                raise EventFileError(f"event file {p} is corrupt at byte {offset} (bad length CRC)")
            end = offset + 12 + length
            section = "data" if end > size else "data crc" if end + 4 > size else None
        if section is not None:
            raise EventFileError(
                f"event file {p} is truncated at byte {size}: the record at byte {offset} ends "
                f"inside its {section}; the run was cut off or the file was damaged")
        body = data[offset + 12:end]
        if _masked(crc(body)) != struct.unpack_from("<I", data, end)[0]:
            raise EventFileError(f"event file {p} is corrupt at byte {offset} (bad data CRC)")
        event = event_pb2.Event()
        try:
            event.ParseFromString(body)
        except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
            raise EventFileError(
                f"event file {p}: record at byte {offset} is no Event ({exc})") from None
        yield event
        offset = end + 4


LR_TAGS = frozenset({"lr", "train/learning_rate"})
"""The learning rate as fairseq (``train_inner/lr``) and the Trainer log it."""

class Scanned(NamedTuple):
    """What the registry reads from one sound event file, once."""

    last_step: int
    peak_lr: tuple[int, float] | None
    """The highest learning rate logged, with its step."""
    first_wall: float | None
    last_wall: float | None
    """The first and last events' wall-clock times (seconds since the epoch)."""
    accuracy_steps: tuple[tuple[str, frozenset[int]], ...] = ()
    """Each accuracy tag with the updates it was logged at."""
    logged: tuple[tuple[str, int, float], ...] = ()
    """The values of :data:`LOGGED_TAGS`, each with its tag and update."""
    loss_times: tuple[tuple[int, float], ...] = ()
    """When each loss was written (its update and wall-clock time): fairseq prints the line of
    that update in its train.log as it writes it."""
    trainer_seed: int | None = None
    """The seed the Trainer's arguments hold (its ``args`` text, which Transformers' TensorBoard
    callback writes first): the run's seed as the process that trained saw it."""
    model_config: str | None = None
    """The model's configuration as the Trainer logged it (JSON text of :data:`CONFIG_TAG`)."""


_CHECKED: dict[tuple[int, int, int, int], Scanned] = {}


def _accuracy_tag(tag: str) -> bool:
    """fairseq's ``accuracy`` and ``best_accuracy``, the Trainer's ``eval/accuracy`` and
    ``test/accuracy``: percentages, which the book's tables read."""
    return tag.rsplit("/", 1)[-1] in ("accuracy", "best_accuracy")


LOGGED_TAGS = frozenset({"loss", "accuracy", "ups", "wps", "wpb", "wall", "train_wall",
                         "train/loss", "train/epoch_loss", "train/train_loss", "train/epoch"})
"""The values :class:`Scanned` keeps (its ``logged``): fairseq's, which its text log prints
too (its rates and its wall meters as well: trial 25's M-k5, M-k7, rates scaled in the log;
check 25b's M-l7, a launch's start-up restamped), the Trainer's training losses, which its
epoch and run means are means of, and its fractional epoch, which its updates give."""


def _metric_tag(tag: str) -> bool:
    """A loss or an accuracy, logged once per update it is measured at (the Trainer logs
    ``train/epoch`` with every entry, so twice at an evaluation's update)."""
    return tag.rsplit("/", 1)[-1] in ("loss", "epoch_loss", "train_loss", "accuracy",
                                      "best_accuracy")


FILE_VERSION = "brain.Event:2"
"""What every writer of the runs here (torch's and tensorboardX's SummaryWriter) puts first."""


def _check_kind(path: Path, index: int, event: Any, last: int) -> None:
    """An event file holds its version first, then summaries at steps that never go back: what
    every run here writes. Anything else (a session-log START, a graph, another version, a step
    back) TensorBoard's EventAccumulator, the book's reader through tbparse, acts on: it drops
    the values logged after a restart, so the book lost a run the registry called valid (trial
    15's E-n3, E-n4)."""
    kind = event.WhichOneof("what")
    if index == 0 and not (kind == "file_version" and event.file_version == FILE_VERSION):
        raise EventFileError(f"event file {path} does not start with its version "
                             f"({FILE_VERSION}), as every writer here does")
    if index > 0 and kind != "summary":
        raise EventFileError(f"event file {path} holds a {kind} event, which no run here "
                             "writes and which the book's reader acts on (a restart drops the "
                             "values logged after it)")
    if kind == "summary" and event.step < last:
        raise EventFileError(f"event file {path} goes back from update {last} to {event.step}")


SCALAR_PLUGINS = ("", "scalars")
"""The plugins a scalar is logged for (none, as fairseq's and Transformers' writers log, or
TensorBoard's scalars); a number tagged for another (text, say) is not read as a scalar."""


def _scan(path: Path) -> Scanned:
    last, peak, walls = 0, None, []
    accuracy: dict[str, set[int]] = {}
    logged: list[tuple[str, int, float]] = []
    loss_times: list[tuple[int, float]] = []
    seen: set[tuple[str, int]] = set()
    trainer_seed = model_config = None
    for index, event in enumerate(strict_events(path)):
        _check_kind(path, index, event, last)
        last = max(last, event.step)
        if event.wall_time:
            walls.append(event.wall_time)
        for value in event.summary.value:
            if value.tag == ARGS_TAG and trainer_seed is None:
                trainer_seed = _args_seed(value)
            if value.tag == CONFIG_TAG and model_config is None and value.tensor.string_val:
                model_config = value.tensor.string_val[0].decode(errors="replace")
            numeric = value.tag in LOGGED_TAGS or value.tag in LR_TAGS or \
                _accuracy_tag(value.tag) or _metric_tag(value.tag)
            if numeric and not value.HasField("simple_value"):  # trial 14's E1
                raise EventFileError(f"event file {path} logs {value.tag} at update "
                                     f"{event.step} as a tensor, not as a scalar value: the "
                                     "book's reader (tbparse) would not see it")
            plugin = value.metadata.plugin_data.plugin_name
            if numeric and plugin not in SCALAR_PLUGINS:  # trial 17's E-p1
                raise EventFileError(f"event file {path} logs {value.tag} at update "
                                     f"{event.step} for the {plugin!r} plugin, not as a scalar: "
                                     "the book's reader (tbparse) would not see it")
            if _metric_tag(value.tag):
                if (value.tag, event.step) in seen:  # a second value the tables could pick
                    raise EventFileError(f"event file {path} logs {value.tag} twice at update "
                                         f"{event.step}")
                seen.add((value.tag, event.step))
            if value.tag in LOGGED_TAGS and (number := _scalar(value)) is not None:
                logged.append((value.tag, event.step, number))
                if value.tag == "loss":
                    loss_times.append((event.step, event.wall_time))
            if value.tag in LR_TAGS:
                lr = _scalar(value)
                if lr is not None and (peak is None or lr > peak[1]):
                    peak = (event.step, lr)
            elif _accuracy_tag(value.tag):
                acc = _scalar(value)
                if acc is not None and not 0.0 <= acc <= 100.0:  # NaN fails both
                    raise EventFileError(f"event file {path}: {value.tag} at update "
                                         f"{event.step} is {acc:g}, not a percentage")
                if acc is not None:
                    accuracy.setdefault(value.tag, set()).add(event.step)
    if not walls:  # every writer stamps each event; a file without a time was edited
        raise EventFileError(f"event file {path} records no wall-clock time")
    return Scanned(last, peak, min(walls, default=None), max(walls, default=None),
                   tuple(sorted((tag, frozenset(steps)) for tag, steps in accuracy.items())),
                   tuple(logged), tuple(loss_times), trainer_seed, model_config)


CONFIG_TAG = "model_config/text_summary"
"""The model's configuration as JSON text (``TensorBoardCallback``'s ``add_text``)."""
ARGS_TAG = "args/text_summary"
"""The Trainer's arguments as JSON text (``TensorBoardCallback``'s ``add_text("args", ...)``)."""


def _args_seed(value: Any) -> int | None:
    """The ``seed`` of a Trainer's arguments text (None when it is not JSON with an int seed:
    nothing recorded, nothing to hold the manifest to)."""
    try:
        seed = json.loads(value.tensor.string_val[0].decode())["seed"]
    except (IndexError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def trainer_seeds(paths: Iterable[Path]) -> set[int]:
    """The seeds the sound files among ``paths`` record in a Trainer's arguments (empty for a
    fairseq run, whose seed its train.log holds)."""
    return {s.trainer_seed for s in _sound(paths) if s.trainer_seed is not None}


def model_configs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The model configurations the sound files among ``paths`` log (those that are JSON
    objects): what the Trainer really loaded, to hold the manifest's init and quantization to."""
    found = []
    for text in {s.model_config for s in _sound(paths) if s.model_config}:
        try:
            config = json.loads(text)
        except ValueError:
            continue
        if isinstance(config, dict):
            found.append(config)
    return found


def _scalar(value: Any) -> float | None:
    """A summary value's number: only a ``simple_value`` is one, as for tbparse's ``scalars``
    (a one-element tensor, even a string, once read here as a number: trial 14's E1)."""
    return float(value.simple_value) if value.HasField("simple_value") else None


def _checked(path: Path) -> tuple[Scanned, str | None]:
    key = _identity(path)
    if key not in _CHECKED:
        try:
            _CHECKED[key] = _scan(path)
        except EventFileError as exc:
            return Scanned(0, None, None, None), str(exc)
    return _CHECKED[key], None


def checked_events(path: Path) -> tuple[int, str | None]:
    """An event file's last step and its problem (None when it parses to the last byte). A
    sound file is checked once per process for a given file (inode), size and modification
    time: a chapter asks the registry about one experiment several times, and every record's
    CRC is costly. A damaged one is read again, so its problem names the path asked for."""
    scanned, problem = _checked(path)
    return scanned.last_step, problem


def _sound(paths: Iterable[Path]) -> list[Scanned]:
    found = []
    for path in paths:
        try:
            scanned, problem = _checked(path)
        except OSError:  # an unreadable file: the registry has named it already
            continue
        if not problem:
            found.append(scanned)
    return found


def peak_learning_rate(paths: Iterable[Path]) -> tuple[int, float] | None:
    """The highest learning rate the sound files among ``paths`` log, and its update: what the
    run's schedule reached, to hold against the recipe its manifest records."""
    peaks = [s.peak_lr for s in _sound(paths) if s.peak_lr]
    return max(peaks, key=lambda p: p[1], default=None)


def all_sound(paths: Sequence[Path]) -> bool:
    """Whether every one of ``paths`` is a sound event file (the registry names the others)."""
    return len(_sound(paths)) == len(paths)


def accuracy_steps(path: Path) -> dict[str, frozenset[int]]:
    """Each accuracy tag a sound event file logs, with the updates it logs it at (empty for a
    damaged or unreadable file, which the registry names already)."""
    found = _sound([path])
    return dict(found[0].accuracy_steps) if found else {}


def logged_values(path: Path) -> tuple[tuple[str, int, float], ...]:
    """:class:`Scanned`'s ``logged`` of a sound event file (empty for a damaged one)."""
    found = _sound([path])
    return found[0].logged if found else ()


def loss_times(path: Path) -> tuple[tuple[int, float], ...]:
    """:class:`Scanned`'s ``loss_times`` of a sound event file (empty for a damaged one)."""
    found = _sound([path])
    return found[0].loss_times if found else ()


def wall_span(paths: Iterable[Path]) -> tuple[float, float] | None:
    """When the sound files among ``paths`` logged their first and last events (seconds since
    the epoch): a run started before the first and ended soon after the last."""
    found = _sound(paths)
    firsts = [s.first_wall for s in found if s.first_wall is not None]
    lasts = [s.last_wall for s in found if s.last_wall is not None]
    return (min(firsts), max(lasts)) if firsts and lasts else None


_AGAINST_LOG: dict[tuple[Any, ...], list[str]] = {}


def once_per_log_and_events(fn: Callable[[str, Path, Sequence[Path]], list[str]]
                            ) -> Callable[[str, Path, Sequence[Path]], list[str]]:
    """``fn(text, run, events)``, a check of a run's log text against its event files that
    names them relative to the run, computed once per process for a given text and the same
    event files (inode, size, modification time, name in the run): a copied run store (the
    tests', a GPU call's) holds the same logs and hard-linked event files, and each
    judgement of the store parsed and compared every value again (issue 36)."""
    @functools.wraps(fn)
    def wrapper(text: str, run: Path, events: Sequence[Path]) -> list[str]:
        try:
            key = (fn.__qualname__, text, files_key(run, events))
        except (OSError, ValueError):  # a file gone or outside the run: computed, not kept
            return fn(text, run, events)
        if key not in _AGAINST_LOG:
            _AGAINST_LOG[key] = fn(text, run, events)
        return list(_AGAINST_LOG[key])
    return wrapper


def files_key(run: Path, files: Sequence[Path]) -> tuple[tuple[Any, ...], ...]:
    """Each file by its name in ``run`` and its identity (inode, size, modification time): what
    a check of them may be kept under (OSError for a file gone, ValueError for one outside)."""
    return tuple((f.relative_to(run).as_posix(), *_identity(f)) for f in files)


def log_text(log: Path) -> str:
    """A run's ``train.log`` as text (a byte that is not UTF-8 replaced, so that it cannot turn
    a check off), read once per process and version of the file (its identity): the registry
    holds each log against its timeline, times, clock, configuration and event values, and
    read it once for each (session 39's review). OSError for a log gone or not a regular file."""
    before = _identity(log)
    if (str(log), before) in _LOG_TEXT:
        return _LOG_TEXT[(str(log), before)]
    text = regular_bytes(log).decode("utf-8", errors="replace")
    if _identity(log) == before:  # kept only if nothing wrote to it meanwhile (a run going on)
        if len(_LOG_TEXT) >= 8:
            _LOG_TEXT.pop(next(iter(_LOG_TEXT)))
        _LOG_TEXT[(str(log), before)] = text
    return text


_LOG_TEXT: dict[tuple[str, tuple[int, int, int, int]], str] = {}


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

