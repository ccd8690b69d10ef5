"""`air`: the command line. Every command has --help with an example; errors are one line, no traceback.

Exit codes (air/cli/app.py): 0 success, 1 the thing checked failed (a baseline missed, a rollout failed, a replay
drifted), 2 bad usage or input, 3 infrastructure unavailable (Docker, an image, the model endpoint, a full disk),
4 a bug in air, 130 interrupted (129 by SIGHUP, 143 by SIGTERM: air.cli.process). One module per command group:
doctor, images, containers, tasks, run, research (debug, eval, replay, view), data, export, serve,
kubernetes.
"""

from __future__ import annotations

import sys

# Top-level commands register themselves on the app when imported; `air --help` lists them in this order.
import air.cli.doctor  # noqa: F401
import air.cli.research  # noqa: F401  (after run: debug, eval, replay, view)
import air.cli.run  # noqa: F401
from air.cli import process
from air.cli.app import app, run_cli
from air.cli.containers import containers_app
from air.cli.data import data_app
from air.cli.export import export_app
from air.cli.images import images_app
from air.cli.kubernetes import kubernetes_app
from air.cli.serve import serve_app
from air.cli.tasks import tasks_app

for name, group in (("images", images_app), ("containers", containers_app), ("tasks", tasks_app),
                    ("data", data_app), ("export", export_app), ("serve", serve_app),
                    ("kubernetes", kubernetes_app)):
    app.add_typer(group, name=name)


def main() -> None:
    process.sturdy_streams()  # for the command line only: a test calling run_cli keeps its own streams and signals
    process.end_like_ctrl_c()
    sys.exit(run_cli(app))


if __name__ == "__main__":
    main()
