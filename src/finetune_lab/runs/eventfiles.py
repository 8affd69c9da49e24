"""Strict reading of TensorBoard event files: a cut-off or corrupted file is named, not skipped.

TensorBoard's own loaders stop quietly at a truncated record (the writer may still be busy),
which is right for a live dashboard but wrong for a report. Here TensorBoard's record reader
(``PyRecordReader_New``, which checks both CRC32C checksums of every record) reads the file to
its last byte, every record must parse as an ``Event``, and the first problem is reported with
the file and the byte offset of the record it is in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune_lab.errors import UserError

RECORD_OVERHEAD = 16
"""Bytes around each record's data: its length (8), the length's CRC (4), the data's CRC (4)."""


class EventFileError(UserError):
    """An event file is truncated, corrupted or not a TensorBoard event file."""


def _problem(path: Path, offset: int, size: int, message: str) -> EventFileError:
    """Turn the reader's ``DataLossError`` message into one that says what to do."""
    if "truncated record" in message:
        section = message.rsplit("truncated record in ", 1)[-1]
        return EventFileError(
            f"event file {path} is truncated at byte {size}: the record at byte {offset} ends "
            f"inside its {section}; the run was cut off or the file was damaged")
    which = "length" if "header crc32" in message else "data"
    return EventFileError(f"event file {path} is corrupt at byte {offset} (bad {which} CRC)")


def read_event_file_strict(path: Path | str) -> int:
    """Parse every record of a TensorBoard event file; return the number of events.

    Raises :class:`EventFileError` naming the file and the byte offset of the first problem.
    """
    return sum(1 for _ in strict_events(path))


def strict_events(path: Path | str) -> Iterator[Any]:
    """Every ``Event`` of a TensorBoard event file, each record checked as
    :func:`read_event_file_strict` says."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    p = Path(path)
    size = p.stat().st_size
    if size == 0:
        raise EventFileError(f"event file {p} is empty (0 bytes)")
    reader = pywrap_tensorflow.PyRecordReader_New(str(p))
    offset = 0
    try:
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:  # a clean end: the last record was complete
                return
            except errors.DataLossError as exc:
                raise _problem(p, offset, size, exc.message) from None
            body = reader.record()
            event = event_pb2.Event()
            try:
                event.ParseFromString(body)
            except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
                raise EventFileError(
                    f"event file {p}: record at byte {offset} is no Event ({exc})") from None
            yield event
            offset += len(body) + RECORD_OVERHEAD
    finally:
        reader.file_handle.close()


_CHECKED: dict[tuple[int, int, int, int], int] = {}


def checked_events(path: Path) -> tuple[int, str | None]:
    """An event file's last step and its problem (None when it parses to the last byte). A
    sound file is checked once per process for a given file (inode), size and modification
    time: a chapter asks the registry about one experiment several times, and every record's
    CRC is costly. A damaged one is read again, so its problem names the path asked for."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _CHECKED:
        try:
            _CHECKED[key] = max((e.step for e in strict_events(path)), default=0)
        except EventFileError as exc:
            return 0, str(exc)
    return _CHECKED[key], None
