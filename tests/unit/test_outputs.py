"""Writing outputs: atomically, to paths of their own, and a lost pipe that is named."""

from __future__ import annotations

import os
import threading

import pytest

from precision_plugin._base.outputs import console, distinct_paths, write_atomic
from precision_plugin.errors import PrecisionConfigError


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    write_atomic(target, '{"new": 1}\n')
    assert target.read_text() == '{"new": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, "\ud800")  # no UTF-8 for a lone surrogate
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_write_atomic_keeps_the_files_mode_and_writes_through_a_link(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    write_atomic(kept, "new")
    assert kept.read_text() == "new" and kept.stat().st_mode & 0o7777 == 0o640
    umask = os.umask(0o027)
    try:
        write_atomic(tmp_path / "fresh.json", "x")  # not mkstemp's 0600
    finally:
        os.umask(umask)
    assert (tmp_path / "fresh.json").stat().st_mode & 0o7777 == 0o640
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "through")
    assert link.is_symlink() and real.read_text() == "through"


def _read_in_background(fifo):
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    return reader, got


def test_write_atomic_writes_a_pipe_or_device_in_place(tmp_path):
    # Before: the temporary file was renamed over the target, so `--json /dev/null` (as root)
    # replaced the device /dev/null with a regular file holding the results. A named pipe
    # stands in for the device here: it is not a regular file either.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader, got = _read_in_background(fifo)
    assert write_atomic(fifo, '{"a": 1}\n') == fifo
    reader.join(10)
    assert got == ['{"a": 1}\n'] and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_pipe_is_a_writable_output_path_whatever_its_folder_allows(tmp_path):
    # /dev/stdout leads to /proc/self/fd, where no file can be created: the pre-run check
    # asked for that, and a device is written in place, so only the device must be writable.
    from precision_plugin.cli.output import check_output_path
    from precision_plugin.errors import PrecisionConfigError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    tmp_path.chmod(0o500)
    try:
        assert check_output_path(str(fifo), "--json") is None
        fifo.chmod(0o400)
        if not os.access(fifo, os.W_OK):  # root may write anything
            with pytest.raises(PrecisionConfigError) as refused:
                check_output_path(str(fifo), "--json")
            assert str(refused.value) == (
                f"--json: cannot write {str(fifo)!r}: no write permission for it; pass a path "
                f"you can write"
            )
    finally:
        tmp_path.chmod(0o700)


def test_an_output_that_is_an_input_or_another_output_is_refused(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    link = tmp_path / "link.txt"
    link.symlink_to(prompts)
    cases = [
        (
            {"--prompts": str(prompts)},
            {"--json": str(prompts)},
            "the same file as the input --prompts",
        ),
        ({"--prompts": str(prompts)}, {"--json": str(tmp_path / "x" / ".." / "p.txt")}, "input"),
        ({"--prompts": str(prompts)}, {"--plot": str(link)}, "destroy the input"),
        ({}, {"--json": "out.json", "--plot": "./out.json"}, "the same file as the output --json"),
    ]
    for inputs, outputs, says in cases:
        with pytest.raises(PrecisionConfigError, match=says):
            distinct_paths(inputs, outputs)
    distinct_paths({"--prompts": None}, {"--json": "-", "--plot": None, "--x": "-"})
    distinct_paths({"--prompts": str(prompts)}, {"--json": "a.json", "--plot": "a.png"})


def test_a_broken_pipe_is_an_oserror_not_rich_s_silent_exit():
    read, write = os.pipe()
    os.close(read)  # the reader has gone, as `| head -c 10` after its bytes
    stream = os.fdopen(write, "w")
    out = console(file=stream)
    with pytest.raises(BrokenPipeError, match="reader of the output has gone"):
        out.print("x" * 100)
    with pytest.raises(BrokenPipeError):
        stream.close()  # what is still buffered cannot go either


def test_a_command_whose_reader_has_gone_says_so_and_exits_74(tmp_path):
    """``precision-plugin doctor | head -c 0``: one line on stderr, exit code 74 (not rich's
    silent exit 1)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PRECISION_PLUGIN": ""}
    env.pop("PRECISION_PLUGIN")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "precision_plugin", "doctor"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=240, env=env, cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 74, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "precision-plugin: error: cannot write the output: Broken pipe (the reader of the output "
        "has gone)."
    )


def test_pgf_is_an_image_format_only_where_its_tex_program_is_installed(monkeypatch):
    # matplotlib lists pgf but its save fails after the whole run without xelatex: the path
    # check before the run must refuse it then.
    import shutil

    from precision_plugin.probe.plot import image_formats

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "pgf" not in image_formats() and "png" in image_formats()
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert "pgf" in image_formats()
