"""``python -m krea2.trainer --config job.toml [--set k=v ...] [--resume]`` (for torchrun)."""

from __future__ import annotations

import sys

from krea2.infra.errors import UserError


def main() -> int:
    import argparse
    from pathlib import Path

    from krea2.trainer.cli import run_job

    parser = argparse.ArgumentParser(prog="python -m krea2.trainer")
    parser.add_argument("--config", "-c", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    try:
        run_job(args.config, args.overrides, args.resume, args.dry_run)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
