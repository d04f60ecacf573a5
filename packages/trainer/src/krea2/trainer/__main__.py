"""``python -m krea2.trainer --config job.toml [--set k=v ...] [--resume [--extend]]``
(for torchrun)."""

from __future__ import annotations

import sys

from krea2.infra.errors import UserError
from krea2.infra.termination import TERMINATED_EXIT_CODE, sigterm_as_interrupt, terminated


def main() -> int:
    import argparse
    from pathlib import Path

    from krea2.trainer.cli import run_job

    parser = argparse.ArgumentParser(prog="python -m krea2.trainer")
    parser.add_argument("--config", "-c", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--extend", action="store_true")
    args = parser.parse_args()
    try:
        with sigterm_as_interrupt():  # what torchrun and schedulers send: stop as Ctrl-C does
            run_job(args.config, args.overrides, args.resume, args.dry_run, args.extend)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("terminated" if terminated() else "interrupted", file=sys.stderr)
        return TERMINATED_EXIT_CODE if terminated() else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
