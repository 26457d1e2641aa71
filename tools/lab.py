"""`make lab`: JupyterLab that stops on the first Ctrl-C, whoever starts it and however.

Two things can keep a Jupyter server running after Ctrl-C:

* a process started in the background by a non-interactive shell (or by some test runners)
  inherits SIGINT as *ignored*, and Python then never turns Ctrl-C into KeyboardInterrupt;
* with a terminal, the server asks "Shutdown this Jupyter server (y/[n])?" and waits.

So SIGINT gets Python's default handler back here, and the Makefile passes
``--ServerApp.answer_yes=True``, which makes the first Ctrl-C shut the server down.
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from jupyterlab.labapp import main as lab_main

    return lab_main()


if __name__ == "__main__":
    sys.exit(main())
