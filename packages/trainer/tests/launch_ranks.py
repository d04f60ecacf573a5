"""Start N ranks of ``python -m krea2.trainer`` with torchrun's environment contract
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without importing torch here.

All ranks share this process's group, so one SIGKILL to the group kills the whole job
(torchrun's agent puts workers elsewhere). Exits with the first non-zero rank status.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def main() -> int:
    n = int(sys.argv[1])
    args = sys.argv[2:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(n):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(subprocess.Popen([sys.executable, "-m", "krea2.trainer", *args], env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
