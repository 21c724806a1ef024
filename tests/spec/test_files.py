"""What a command writes (spec/files.py, ``Destination``): never over what it reads, never over an existing
file unasked, side files only beside a regular file, and whole or not at all. The commands that write
(``export``, ``report``, ``chat-corpus``) each go through it: tests/views/test_export.py,
tests/views/test_report.py and tests/spec/test_chat_corpus.py run them."""

from __future__ import annotations

import os

import pytest

from autotune.errors import AutotuneError
from autotune.spec.files import Destination, write_output
from autotune.storage import storage_files


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    out = tmp_path / "best_args.json"
    out.write_text("the user's own file\n")
    with pytest.raises(AutotuneError, match=r"the file exists .* pass --force to replace it"):
        write_output(str(out), "new\n")
    assert out.read_text() == "the user's own file\n"
    write_output(str(out), "new\n", force=True)
    assert out.read_text() == "new\n"


@pytest.mark.parametrize("name", ["study.db", "study.db-journal", "study.db-wal", "study.db-shm"])
def test_the_storage_a_command_reads_is_never_written_even_with_force(tmp_path, name):
    """Its database and SQLite's journals of it, by name, through a symbolic link, or a hard link."""
    database = tmp_path / "study.db"
    database.write_bytes(b"SQLite format 3\x00")
    keep = storage_files(f"sqlite:///{database}")
    (tmp_path / "link.db").symlink_to(database)
    os.link(database, tmp_path / "hard.db")
    for out in [tmp_path / name, tmp_path / "link.db", tmp_path / "hard.db", tmp_path / "sub" / ".." / name]:
        if name != "study.db" and out.name in ("link.db", "hard.db"):
            continue
        with pytest.raises(AutotuneError, match="that is the study's database, which this command reads"):
            Destination(str(out), force=True, keep=keep).write({str(out): "{}\n"})
    assert database.read_bytes() == b"SQLite format 3\x00"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.db", "link.db", "study.db"]


def test_a_directory_is_refused_and_a_device_is_written_in_place(tmp_path):
    with pytest.raises(AutotuneError, match="it is a directory"):
        write_output(str(tmp_path), "x", force=True)
    write_output("/dev/null", "x")  # a device: written in place, never replaced, no --force needed


def test_side_files_only_beside_a_regular_file(tmp_path):
    assert Destination(str(tmp_path / "new.json")).side_files
    (tmp_path / "old.json").write_text("{}")
    assert Destination(str(tmp_path / "old.json")).side_files
    assert not Destination("-").side_files
    assert not Destination("/dev/null").side_files
    os.mkfifo(tmp_path / "pipe")
    assert not Destination(str(tmp_path / "pipe")).side_files


def test_every_path_is_checked_before_the_first_is_written(tmp_path):
    """A side file that would replace a file unasked leaves nothing written, the main file included."""
    (tmp_path / "best_args.adapter_config.json").write_text("the user's adapters\n")
    files = {str(tmp_path / "best_args.json"): "{}\n", str(tmp_path / "best_args.adapter_config.json"): "{}\n"}
    with pytest.raises(AutotuneError, match="best_args.adapter_config.json: the file exists"):
        Destination(str(tmp_path / "best_args.json")).write(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best_args.adapter_config.json"]
    assert (tmp_path / "best_args.adapter_config.json").read_text() == "the user's adapters\n"


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, OSError])
def test_a_write_cut_short_leaves_no_file_behind(tmp_path, interruption):
    """Ctrl-C or an error while streaming: neither the file nor its temporary file stays."""

    def write(stream):
        stream.write("half a corpus\n")
        raise interruption()

    with pytest.raises((KeyboardInterrupt, AutotuneError)):
        Destination(str(tmp_path / "chat.jsonl")).stream(write)
    assert list(tmp_path.iterdir()) == []
