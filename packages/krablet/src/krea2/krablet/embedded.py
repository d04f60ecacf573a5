"""Embedded shards: real PostgreSQL 16 servers from the ``pgserver`` wheel, one directory each."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from krea2.infra.errors import UserError

logging.getLogger("pgserver").setLevel(logging.WARNING)


def _server_class():
    if not os.environ.get("XDG_RUNTIME_DIR"):  # pgserver keeps a lock file there
        runtime = Path(f"/tmp/krablet-runtime-{os.geteuid()}")
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    import pgserver

    return pgserver.PostgresServer, pgserver.get_server


def start_shard(pgdata: str | Path) -> str:
    """Start (initialising if needed) the server in ``pgdata``; return its DSN (a Unix socket).

    The server keeps running after this process exits; stop it with :func:`stop_shard`.
    """
    server_cls, get_server = _server_class()
    pgdata = Path(pgdata).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server_cls._instances.pop(pgdata, None)  # re-read postmaster state after a stop
    try:
        server = get_server(pgdata, cleanup_mode=None)
    except subprocess.CalledProcessError as exc:
        log = pgdata / "log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise UserError(
            f"could not start the embedded Postgres in {pgdata}: {exc}\n{tail}"
        ) from None
    return server.get_uri()


def _pg_user() -> str | None:
    return "pgserver" if os.geteuid() == 0 else None


def stop_shard(pgdata: str | Path, mode: str = "fast") -> bool:
    """Stop the server in ``pgdata`` (pg_ctl mode: smart, fast, immediate); False if not running."""
    _server_class()
    from pgserver._commands import pg_ctl

    pgdata = Path(pgdata).expanduser().resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    try:
        pg_ctl(["-w", "-m", mode, "stop"], pgdata=pgdata, user=_pg_user(), timeout=60)
    except subprocess.CalledProcessError:
        return False
    return True


def up(n_shards: int, data_dir: str | Path) -> list[str]:
    """Start ``n_shards`` shards under ``data_dir`` (``shard-000`` …); return their DSNs."""
    if n_shards < 1:
        raise UserError(f"--shards must be at least 1, got {n_shards}")
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    return [start_shard(data_dir / f"shard-{i:03d}") for i in range(n_shards)]


def down(data_dir: str | Path) -> int:
    """Stop every embedded shard under ``data_dir``; return how many were running."""
    return sum(stop_shard(p) for p in sorted(Path(data_dir).glob("shard-*")))
