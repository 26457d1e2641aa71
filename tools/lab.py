"""`make lab`: JupyterLab that stops on the first Ctrl-C, cleanly, whoever starts it and however.

Three things can keep a Jupyter server running after Ctrl-C, or leave its files behind:

* a process started in the background by a non-interactive shell (or by some test runners)
  inherits SIGINT as *ignored*, and Python then never turns Ctrl-C into KeyboardInterrupt;
* with a terminal, the server asks "Shutdown this Jupyter server (y/[n])?" and waits;
* without a terminal, the server does not handle SIGINT itself: the KeyboardInterrupt ends its
  event loop without its clean-up, so its runtime files (``jpserver-<pid>.json``/``-open.html``)
  stay behind.

So once the server has set up its signal handlers, SIGINT is replaced here by a clean stop (the
server's own ``stop()``: kernels shut down, runtime files removed), and a second Ctrl-C interrupts
at once. The Makefile also passes ``--ServerApp.answer_yes=True``, so no prompt is ever shown.
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from jupyter_server.serverapp import ServerApp
    from jupyterlab.labapp import main as lab_main

    server_init_signal = ServerApp.init_signal

    def init_signal(self: ServerApp) -> None:
        server_init_signal(self)

        def stop(signum, frame) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # twice: stop at once
            self.log.info("Ctrl-C: shutting down the server")
            self.stop(from_signal=True)

        signal.signal(signal.SIGINT, stop)

    ServerApp.init_signal = init_signal
    return lab_main()


if __name__ == "__main__":
    sys.exit(main())
