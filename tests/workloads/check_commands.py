"""Run inside the speculators environment: parse command lines with the real speculators CLI.

stdin: a JSON list of argv lists (`speculators SUBCOMMAND ...` or `speculators train ...`).
stdout: a JSON list of {"argv", "ok", "error"}. `train` lines are resolved with --dump-config (the
real argparse parser plus speculators' own cross-field checks); the typer commands are parsed by
their click command without being run.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def check(argv: list[str]) -> dict[str, object]:
    import typer
    from speculators.__main__ import app

    assert argv[0] == "speculators", argv
    name, args = argv[1], argv[2:]
    if name == "train":
        from speculators.train.config import TrainConfig

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                TrainConfig.resolve([*args, "--dump-config"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
                return {"argv": argv, "ok": code == 0, "error": err.getvalue()[-2000:]}
        return {"argv": argv, "ok": False, "error": "--dump-config did not exit"}
    group = typer.main.get_command(app)  # typer bundles its own click: duck-typed here
    command = group.commands.get(name)  # type: ignore[attr-defined]
    if command is None:
        return {"argv": argv, "ok": False, "error": f"no such command {name}"}
    try:
        command.make_context(name, list(args))
    except Exception as exc:  # typer's bundled click.UsageError and friends
        if not hasattr(exc, "format_message"):
            raise
        return {"argv": argv, "ok": False, "error": exc.format_message()}
    return {"argv": argv, "ok": True, "error": ""}


if __name__ == "__main__":
    print(json.dumps([check(a) for a in json.load(sys.stdin)]))
