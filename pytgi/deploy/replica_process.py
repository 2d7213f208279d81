"""`python -m pytgi.deploy.replica_process serve ...`: `pytgi serve` that dies with its parent.

A Ray Serve replica starts its server through this module with a pipe on stdin. The replica
holds the pipe's other end; when the replica's process ends for any reason (SIGKILL included),
the kernel closes it, the read below returns, and the server is killed at once. Its engine
process follows by itself (it watches the launcher's pid), so no server outlives its replica.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def _die_with_parent() -> None:
    sys.stdin.buffer.read()  # returns only at EOF: the parent's end of the pipe is closed
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    threading.Thread(target=_die_with_parent, name="parent-watch", daemon=True).start()
    from pytgi.cli.main import main as cli_main

    return cli_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
