"""Output paths are the user's: a FIFO, a link or a device at ``-o`` is never replaced (repro.core.outputs)."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from repro.cli.main import main
from repro.core.outputs import OutputPathError, check_output, output_file, write_output

PLAN_ARGS = ["plan", "--trace", "resnet50_b64_v100-estimate", "--solver", "mgwfbp", "--network", "10gbe-v100",
             "--workers", "16"]


def _read_fifo(path: Path, out: list[bytes]) -> threading.Thread:
    def reader():
        with open(path, "rb") as f:
            out.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return t


def _wait_for_reader(t: threading.Thread) -> None:
    import time

    time.sleep(0.2)  # the reader blocks in open() until a writer comes; give it time to get there


def test_regular_file_is_replaced_whole(tmp_path):
    p = tmp_path / "out.json"
    p.write_text("old")
    assert write_output(p, "new") == p
    assert p.read_text() == "new"
    assert [q.name for q in tmp_path.iterdir()] == ["out.json"]  # no temporary left beside it


def test_fifo_stays_a_fifo_and_gets_the_content(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    t = _read_fifo(fifo, got)
    _wait_for_reader(t)
    assert main([*PLAN_ARGS, "-o", str(fifo)]) == 0
    t.join(10)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert b'"solver": "mgwfbp"' in got[0]


def test_fifo_without_reader_is_refused_not_waited_on(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main([*PLAN_ARGS, "-o", str(fifo)]) == 2
    assert "FIFO with no process reading it" in capsys.readouterr().err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_symlink_stays_a_link_and_its_target_is_written(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)  # relative link
    assert main([*PLAN_ARGS, "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == target.name
    assert '"solver": "mgwfbp"' in target.read_text()


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    write_output(link, "x")
    assert link.is_symlink() and (tmp_path / "new.json").read_text() == "x"


def test_symlink_loop_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(OutputPathError, match="symbolic links"):
        check_output(a)


def test_dev_null_stays_a_character_device(capsys):
    before = os.stat("/dev/null")
    assert main([*PLAN_ARGS, "-o", "/dev/null"]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_character_device_node_is_written_into_not_replaced(tmp_path):
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    assert main([*PLAN_ARGS, "-o", str(dev)]) == 0
    assert stat.S_ISCHR(dev.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary beside the device


def test_socket_and_folder_are_refused(tmp_path):
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output(tmp_path)
    sock = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock))
        with pytest.raises(OutputPathError, match="socket"):
            write_output(sock, "x")
        assert stat.S_ISSOCK(sock.lstat().st_mode)
    finally:
        s.close()


def test_missing_folder_and_path_below_a_file_are_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        check_output(tmp_path / "f" / "out.json")
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output(tmp_path / "nope" / "out.json")


def test_longest_legal_name_is_accepted(tmp_path):
    name = "x" * 250 + ".json"  # 255 bytes: the longest name most file systems take
    write_output(tmp_path / name, "ok")
    assert (tmp_path / name).read_text() == "ok"


def test_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "fig.png"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with output_file(p) as tmp:
            assert tmp.suffix == ".png" and tmp.parent == tmp_path
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert p.read_bytes() == b"old"
    assert [q.name for q in tmp_path.iterdir()] == ["fig.png"]


def test_check_output_writes_nothing(tmp_path):
    check_output(tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


# --- issue 33: an output keeps the mode of the file it replaces; a path ending in / names a folder; the
# output path of the measuring commands is checked before any measurement

@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_output_over_a_file_keeps_its_mode(tmp_path, mode):
    p = tmp_path / "plan.json"
    p.write_text("old")
    os.chmod(p, mode)
    assert main([*PLAN_ARGS, "-o", str(p)]) == 0
    assert '"solver": "mgwfbp"' in p.read_text()
    assert stat.S_IMODE(p.stat().st_mode) == mode


def test_output_through_a_link_keeps_the_targets_mode(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    (tmp_path / "link.json").symlink_to(target.name)
    write_output(tmp_path / "link.json", "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_read_only_output_file(tmp_path, capsys):
    """A 0444 file: refused like a shell redirection refuses it; root (whom the shell lets write it) gets the
    new content with the mode kept, 0444, never a world-writable or 0644 file."""
    p = tmp_path / "plan.json"
    p.write_text("old")
    os.chmod(p, 0o444)
    rc = main([*PLAN_ARGS, "-o", str(p)])
    if os.geteuid() == 0:
        assert rc == 0 and '"solver": "mgwfbp"' in p.read_text()
    else:
        assert rc == 2 and "read-only" in capsys.readouterr().err and p.read_text() == "old"
    assert stat.S_IMODE(p.stat().st_mode) == 0o444


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_output_over_a_file_keeps_its_owner_and_group(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("old")
    os.chown(p, 12345, 23456)
    write_output(p, "new")
    st = p.stat()
    assert (st.st_uid, st.st_gid) == (12345, 23456) and p.read_text() == "new"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_output_file_gets_the_umask_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_output(tmp_path / "a.json", "x")
        with output_file(tmp_path / "b.csv") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(old)
    for name in ("a.json", "b.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask


OUTPUT_COMMANDS = {  # every command with -o/--output, with the least that makes it run
    "plan": PLAN_ARGS[1:],
    "simulate": ["--trace", "resnet50_b64_v100-estimate", "--plan", "PLAN", "--network", "10gbe-v100",
                 "--workers", "16"],
    "compare": ["--trace", "resnet50_b64_v100-estimate", "--network", "10gbe-v100", "--workers", "16"],
    "cost fit": ["MEASUREMENTS"],
    "cost cluster": ["--gpus-per-node", "8", "--inter-link", "25gbit"],
    "profile": ["--model", "tiny_vgg", "--batch-size", "2"],
    "calibrate": ["--nproc", "2"],
}


def test_every_output_option_is_covered():
    from repro.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.choices and "plan" in a.choices)
    found = set()
    for name, p in sub.choices.items():
        nested = [a for a in p._actions if a.choices and isinstance(a.choices, dict)]
        for q_name, q in ((f"{name} {n}", q) for a in nested for n, q in a.choices.items()) if nested else [(name, p)]:
            if any("-o" in a.option_strings for a in q._actions):
                found.add(q_name)
    assert found == set(OUTPUT_COMMANDS)


@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_output_ending_in_a_slash_names_a_folder(tmp_path, capsys, monkeypatch, command):
    """``-o newdir/`` for a missing folder is refused in one line (no command has a default file name to
    put inside it); ``-o file.json/`` too; nothing is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.json").write_text("old")

    def measured(*_a, **_k):
        raise AssertionError("measured before checking the output path")

    monkeypatch.setattr("repro.workload.profile.profile_model", measured)
    monkeypatch.setattr("repro.cli.main._launch", measured)
    args = [a.replace("PLAN", str(tmp_path / "f.json")).replace("MEASUREMENTS", str(tmp_path / "f.json"))
            for a in OUTPUT_COMMANDS[command]]
    for out, words in (("newdir/", "newdir/ names a folder that does not exist"),
                       ("f.json/", "f.json/ names a folder, but f.json is a file")):
        assert main([*command.split(), *args, "-o", out]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    assert (tmp_path / "f.json").read_text() == "old"


def test_output_ending_in_a_slash_for_an_existing_folder(tmp_path):
    with pytest.raises(OutputPathError, match="is a folder"):
        write_output(f"{tmp_path}/", "x")
    with pytest.raises(OutputPathError, match="names a folder that does not exist"):
        write_output(f"{tmp_path}/new/", "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["calibrate", "profile"])
def test_fifo_without_reader_is_refused_before_measuring(tmp_path, capsys, monkeypatch, command):
    import time

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def measured(*_a, **_k):
        raise AssertionError("measured before checking the output path")

    monkeypatch.setattr("repro.workload.profile.profile_model", measured)
    monkeypatch.setattr("repro.runtime.calibrate.fit_on_ranks", measured)
    monkeypatch.setattr("repro.cli.main._launch", measured)
    t0 = time.perf_counter()
    rc = main([command, *OUTPUT_COMMANDS[command], "-o", str(fifo)])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "FIFO with no process reading it" in err, err
    assert took < 5, took
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_fifo_checked_early_still_gets_the_whole_content(tmp_path):
    """The check holds the FIFO open from the start, so a reader that came first sees no early end of file
    and gets everything written at the end."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    t = _read_fifo(fifo, got)
    _wait_for_reader(t)
    check_output(fifo)
    import time

    time.sleep(0.3)  # the measurement
    assert t.is_alive()  # no end of file yet
    write_output(fifo, "whole")
    t.join(10)
    assert got == [b"whole"]
