"""Strict event-file reading on files written by TensorBoard's own writer, then damaged."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c, masked_crc32c
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from finetune_lab.runs import eventfiles
from finetune_lab.runs.eventfiles import EventFileError, read_event_file_strict


@pytest.fixture(params=["c", "python"])
def crc(request, monkeypatch):
    """Each CRC-32C the reader may use: google-crc32c's C code (the lock's), or TensorBoard's
    Python one where that is not installed."""
    if request.param == "python":
        monkeypatch.setattr(eventfiles, "_crc32c", lambda: crc32c)
    return eventfiles._crc32c()


def _write_events(folder: Path, n: int = 3) -> Path:
    writer = EventFileWriter(str(folder))
    for step in range(n):
        value = summary_pb2.Summary.Value(tag="loss", simple_value=float(step))
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0,
                                         summary=summary_pb2.Summary(value=[value])))
    writer.close()
    (path,) = folder.glob("events.out.tfevents*")
    return path


def _record_offsets(data: bytes) -> list[int]:
    """Where each record starts, read from the length fields by hand (8 + 4 + length + 4)."""
    offsets, at = [], 0
    while at < len(data):
        offsets.append(at)
        at += 16 + struct.unpack("<Q", data[at:at + 8])[0]
    return offsets


def test_the_crc_is_crc32c(crc) -> None:
    assert crc(b"123456789") == 0xE3069283  # the published CRC-32C check value


def test_the_locked_crc_is_the_c_one() -> None:
    import google_crc32c

    assert google_crc32c.implementation == "c" and eventfiles._crc32c() is google_crc32c.value


def test_every_record_is_counted(tmp_path: Path, crc) -> None:
    path = _write_events(tmp_path, n=3)
    assert read_event_file_strict(path) == 4  # the writer's file_version event + 3 scalars
    assert len(_record_offsets(path.read_bytes())) == 4


def test_a_cut_off_file_names_its_last_record(tmp_path: Path, crc) -> None:
    path = _write_events(tmp_path)
    data = path.read_bytes()
    last = _record_offsets(data)[-1]
    path.write_bytes(data[:-7])
    with pytest.raises(EventFileError, match=rf"truncated at byte {len(data) - 7}: the record "
                                             rf"at byte {last} ends inside its data"):
        read_event_file_strict(path)
    path.write_bytes(data[:last + 5])  # inside the next record's length field
    with pytest.raises(EventFileError, match=rf"record at byte {last} ends inside its header"):
        read_event_file_strict(path)


def test_corrupt_records_are_named_by_checksum(tmp_path: Path, crc) -> None:
    path = _write_events(tmp_path)
    data = path.read_bytes()
    second = _record_offsets(data)[1]
    damaged = bytearray(data)
    damaged[second + 14] ^= 0x01  # a bit of the second record's data
    path.write_bytes(bytes(damaged))
    with pytest.raises(EventFileError, match=rf"corrupt at byte {second} \(bad data CRC\)"):
        read_event_file_strict(path)
    damaged = bytearray(data)
    damaged[second] ^= 0x01  # a bit of its length
    path.write_bytes(bytes(damaged))
    with pytest.raises(EventFileError, match=rf"corrupt at byte {second} \(bad length CRC\)"):
        read_event_file_strict(path)


def test_a_record_that_is_no_event_and_an_empty_file(tmp_path: Path, crc) -> None:
    path = _write_events(tmp_path)
    data = path.read_bytes()
    body = b"\x0a\xff"  # a length-delimited field 255 bytes long, in 1 byte: not an Event
    length = struct.pack("<Q", len(body))
    path.write_bytes(data + length + struct.pack("<I", masked_crc32c(length)) + body
                     + struct.pack("<I", masked_crc32c(body)))
    with pytest.raises(EventFileError, match=rf"record at byte {len(data)} is no Event"):
        read_event_file_strict(path)
    path.write_bytes(b"")
    with pytest.raises(EventFileError, match="is empty"):
        read_event_file_strict(path)
