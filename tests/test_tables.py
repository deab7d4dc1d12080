"""repro.results.tables: git_revision reads the checkout without taking .git/index.lock."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from repro.results import tables
from repro.results.tables import git_revision

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A fresh repository with one committed file, isolated from the user's git configuration."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OPTIONAL_LOCKS"):
        monkeypatch.delenv(var, raising=False)
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.txt").write_text("one\n")
    _git(r, "add", "a.txt")
    _git(r, "commit", "-q", "-m", "first")
    return r


def _make_stat_dirty(repo: Path) -> None:
    """Same content, different mtime: a plain `git status` refreshes and rewrites the index."""
    st = (repo / "a.txt").stat()
    os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns - 10**12))


def _index_state(repo: Path) -> tuple[bytes, int]:
    idx = repo / ".git" / "index"
    return idx.read_bytes(), idx.stat().st_mtime_ns


def test_clean_and_dirty(repo):
    head = _git(repo, "rev-parse", "HEAD")
    assert git_revision(repo) == head
    (repo / "untracked.txt").write_text("ignored: untracked files do not make the tree dirty\n")
    assert git_revision(repo) == head
    (repo / "a.txt").write_text("two\n")
    assert git_revision(repo) == f"{head}-dirty"
    (repo / "a.txt").write_text("one\n")
    assert git_revision(repo) == head
    _git(repo, "rm", "-q", "--cached", "a.txt")  # a staged change is dirty too
    assert git_revision(repo) == f"{head}-dirty"


def test_not_a_repository(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "plain").mkdir()
    assert git_revision(tmp_path / "plain") is None


def test_works_beside_a_stale_index_lock_and_leaves_it_alone(repo):
    head = _git(repo, "rev-parse", "HEAD")
    lock = repo / ".git" / "index.lock"
    lock.write_bytes(b"held by someone else")
    _make_stat_dirty(repo)
    before = _index_state(repo)
    assert git_revision(repo) == head
    (repo / "a.txt").write_text("two\n")
    assert git_revision(repo) == f"{head}-dirty"
    assert lock.read_bytes() == b"held by someone else", "the other holder's lock was touched"
    assert _index_state(repo) == before


def test_does_not_rewrite_the_index(repo):
    """A plain `git status` takes index.lock to write a refreshed index; git_revision must not."""
    head = _git(repo, "rev-parse", "HEAD")
    _make_stat_dirty(repo)
    before = _index_state(repo)
    assert git_revision(repo) == head
    assert _index_state(repo) == before, "git_revision wrote .git/index (so it took index.lock)"
    assert not (repo / ".git" / "index.lock").exists()
    # Control: the same situation does make a plain `git status` rewrite the index, so the check above
    # can tell the difference.
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, check=True)
    assert _index_state(repo) != before


def test_every_git_call_disables_optional_locks(repo, monkeypatch):
    head = _git(repo, "rev-parse", "HEAD")
    calls = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        calls.append((list(cmd), kwargs.get("env")))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(tables.subprocess, "run", spy)
    assert git_revision(repo) == head
    git_calls = [(c, env) for c, env in calls if c[0] == "git"]
    assert any("status" in c for c, _ in git_calls)
    for cmd, env in git_calls:
        assert cmd[1] == "--no-optional-locks", cmd
        assert env is not None and env.get("GIT_OPTIONAL_LOCKS") == "0", cmd
