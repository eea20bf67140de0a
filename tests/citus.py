"""A Citus coordinator and workers on 127.0.0.1, started from the installation KBPG_CITUS_PG names.

KBPG_CITUS_PG is a PostgreSQL installation directory (with bin/pg_ctl, bin/initdb) that has the
citus extension (and pgvector) installed: no package registry ships one, so it is built by hand
(docs/citus.md: the build). This module only starts servers: each node is a throwaway data
directory (fsync off) with `shared_preload_libraries = citus`, listening on loopback only; as
root, the servers run as an unprivileged OS user (KBPG_CITUS_USER, default kbpg-postgres,
created when missing), since PostgreSQL refuses to run as root.

    python tests/citus.py /tmp/kbpg-citus start     # prints the coordinator's URL
    python tests/citus.py /tmp/kbpg-citus stop

A database is made on every node at once (`Cluster.create_database`): the citus extension in
each, the workers registered with the coordinator; kbpg then migrates and distributes it
through the coordinator's URL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

ENV_INSTALL = "KBPG_CITUS_PG"
ENV_USER = "KBPG_CITUS_USER"
DEFAULT_USER = "kbpg-postgres"
SUPERUSER = "postgres"
FIRST_PORT = 57630


def installation() -> Path | None:
    """The installation KBPG_CITUS_PG names, when it has Citus (else None)."""
    value = os.environ.get(ENV_INSTALL)
    if not value:
        return None
    path = Path(value)
    if not (path / "bin" / "pg_ctl").exists():
        return None
    if not list((path / "share").glob("**/extension/citus.control")):
        return None
    return path


def skip_reason() -> str:
    value = os.environ.get(ENV_INSTALL)
    if not value:
        return f"{ENV_INSTALL} is not set (a PostgreSQL installation with Citus built in)"
    return f"{ENV_INSTALL}={value} is not a PostgreSQL installation with Citus (bin/pg_ctl, citus.control)"


def _run_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    name = os.environ.get(ENV_USER, DEFAULT_USER)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=False,
            capture_output=True,
        )
        return pwd.getpwnam(name)


@dataclass(frozen=True)
class Node:
    name: str
    port: int
    pgdata: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"


class Cluster:
    """A coordinator and `workers` workers under `home` (one data directory each)."""

    def __init__(self, install: Path, home: Path, workers: int = 2, port: int = FIRST_PORT) -> None:
        self.install = install
        self.home = home
        self.nodes = [
            Node(name, port + i, home / name)
            for i, name in enumerate(["coordinator", *(f"worker{i + 1}" for i in range(workers))])
        ]

    @property
    def coordinator(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def _run(self, argv: list[str], timeout: float = 120) -> None:
        user = _run_user()
        result = subprocess.run(
            [str(self.install / "bin" / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            cwd=self.home,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {result.stderr or result.stdout}")

    def _init(self, node: Node) -> None:
        user = _run_user()
        node.pgdata.mkdir(mode=0o700, parents=True)
        if user:
            os.chown(node.pgdata, user.pw_uid, user.pw_gid)
        self._run(
            [
                "initdb",
                "-D",
                str(node.pgdata),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-instructions",
            ]
        )
        settings = {
            "shared_preload_libraries": "'citus'",
            "listen_addresses": "'127.0.0.1'",
            "port": str(node.port),
            "unix_socket_directories": f"'{node.pgdata}'",
            "max_connections": "200",
            "shared_buffers": "'512MB'",
            "maintenance_work_mem": "'512MB'",
            "work_mem": "'16MB'",
            "max_worker_processes": "32",
            "wal_level": "logical",  # shard moves
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
            # the embedded wheel's libpq has no OpenSSL
            "citus.node_conninfo": "'sslmode=disable'",
            "citus.max_cached_conns_per_worker": "4",
            "citus.enable_statistics_collection": "off",
        }
        with open(node.pgdata / "postgresql.conf", "a") as conf:
            conf.write("\n# kbpg test cluster (tests/citus.py)\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self) -> str:
        """Initialise (first time) and start every node; the coordinator's `postgres` URL."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o755)
        for node in self.nodes:
            if not (node.pgdata / "PG_VERSION").exists():
                self._init(node)
            if not self._running(node):
                log = node.pgdata / "server.log"
                try:
                    self._run(["pg_ctl", "-D", str(node.pgdata), "-l", str(log), "-w", "-t", "60",
                               "start"])  # fmt: skip
                except RuntimeError as e:
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"{e}\n{node.name}'s server.log ends:\n{tail}") from e
        return self.coordinator.url()

    def _running(self, node: Node) -> bool:
        with contextlib.suppress(psycopg.Error), psycopg.connect(node.url(), connect_timeout=2):
            return True
        return False

    def stop(self) -> None:
        for node in self.nodes:
            if (node.pgdata / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    self._run(["pg_ctl", "-D", str(node.pgdata), "-m", "fast", "-w", "stop"])

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def create_database(self, name: str, *, worker_count: int | None = None) -> str:
        """`name` on every node with the citus extension, the workers (all, or the first
        worker_count) registered with the coordinator; the coordinator's URL of it."""
        for node in self.nodes:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute(f'drop database if exists "{name}" with (force)')
                conn.execute(f'create database "{name}"')
            with psycopg.connect(node.url(name), autocommit=True) as conn:
                conn.execute("create extension citus")
        with psycopg.connect(self.coordinator.url(name), autocommit=True) as conn:
            conn.execute(
                "select pg_catalog.citus_set_coordinator_host('127.0.0.1', %s)",
                (self.coordinator.port,),
            )
            workers = self.workers if worker_count is None else self.workers[:worker_count]
            for worker in workers:
                conn.execute("select pg_catalog.citus_add_node('127.0.0.1', %s)", (worker.port,))
        return self.coordinator.url(name)

    def drop_database(self, name: str) -> None:
        for node in self.nodes:
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(node.url(), autocommit=True) as conn,
            ):
                conn.execute(f'drop database if exists "{name}" with (force)')

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not all(self._running(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come up")
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path, help="directory for the nodes' data directories")
    parser.add_argument("action", choices=["start", "stop", "remove", "database"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=FIRST_PORT)
    parser.add_argument("--database", default="kbpg", help="with `database`: its name")
    args = parser.parse_args()
    install = installation()
    if install is None:
        sys.exit(skip_reason())
    cluster = Cluster(install, args.home, args.workers, args.port)
    if args.action == "start":
        print(cluster.start())
    elif args.action == "stop":
        cluster.stop()
    elif args.action == "remove":
        cluster.remove()
    else:
        print(cluster.create_database(args.database))


if __name__ == "__main__":
    main()
