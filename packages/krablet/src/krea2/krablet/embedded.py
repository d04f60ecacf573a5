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
        if runtime.stat().st_uid != os.geteuid():
            raise UserError(
                f"{runtime} belongs to another user: set XDG_RUNTIME_DIR to a private directory"
            )
        runtime.chmod(0o700)  # another tool may have created it first, readable by all
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


def shard_dir(data_dir: str | Path, shard: int) -> Path:
    """The data directory of embedded shard ``shard`` under ``data_dir`` (``shard-000`` …)."""
    return Path(data_dir).expanduser().resolve() / f"shard-{shard:03d}"


def _check_shard(shard: int | None, n_shards: int) -> None:
    if shard is not None and not 0 <= shard < n_shards:
        raise UserError(f"--shard {shard} is not a shard of this cluster (0 … {n_shards - 1})")


def up(n_shards: int, data_dir: str | Path, shard: int | None = None) -> dict[int, str]:
    """Start the shards under ``data_dir`` (or only ``shard``); return their DSNs by index."""
    if n_shards < 1:
        raise UserError(f"--shards must be at least 1, got {n_shards}")
    _check_shard(shard, n_shards)
    Path(data_dir).expanduser().resolve().mkdir(parents=True, exist_ok=True)
    todo = range(n_shards) if shard is None else [shard]
    return {i: start_shard(shard_dir(data_dir, i)) for i in todo}


def down(data_dir: str | Path, shard: int | None = None) -> int:
    """Stop every embedded shard under ``data_dir`` (or only ``shard``); return how many were
    running."""
    if shard is not None:
        _check_shard(shard, len(list(Path(data_dir).glob("shard-*"))))
        return int(stop_shard(shard_dir(data_dir, shard)))
    return sum(stop_shard(p) for p in sorted(Path(data_dir).glob("shard-*")))
