"""Exec a command that dies with its parent: `python -m maas_tools.local.guard PPID CMD...`.

The kernel's parent-death signal must be requested by the child itself.
Doing it in a Popen preexec_fn would fork a process that may already run
gRPC threads, which gRPC's fork handlers do not survive; so the child is
spawned plainly (vfork/exec) and sets the signal here, then execs the real
command, which keeps it.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, argv = int(sys.argv[1]), sys.argv[2:]
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # The parent may have died before the signal was armed: then nobody will send it.
    if os.getppid() != parent:
        sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
