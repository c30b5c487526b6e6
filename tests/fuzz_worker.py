"""A worker process of the bad-input suite (started by tests/fuzz_pool.py): runs the cases it is sent
(``(name, params)`` frames on stdin) and answers ``(kind, detail)`` frames on stdout. MindSpore, mindnlp and the
package (tests/fuzz_cases.py) are imported once, at the first case that needs them, so a worker that replaces a
crashed one is ready at once. A crash here kills only this process; the pool records it and starts another."""

import faulthandler
import os
import sys
import warnings

faulthandler.enable()  # a native crash leaves its stack in the worker's log
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
warnings.simplefilter("ignore")

stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # anything the cases print goes to the log, not into the frame stream

from fuzz_pool import receive, send  # noqa: E402


def selftest(action: str):
    """The driver's own check (tests/test_fuzz_driver.py): a crash, an abort, an exit, a hang, or an answer."""
    import ctypes as ct
    import time

    if action == "segfault":
        ct.string_at(0)
    elif action == "abort":
        os.abort()
    elif action == "exit":
        os._exit(3)
    elif action == "hang":
        time.sleep(3600)
    return "ok", str(os.getpid()) if action == "pid" else action


def main() -> None:
    send(stdout, "ready")
    while True:
        try:
            msg = receive(stdin)
        except EOFError:
            return
        if msg is None:
            return
        name, params = msg
        if name == "selftest":
            send(stdout, selftest(**params))
            continue
        import fuzz_cases  # noqa: E402  (MindSpore, mindnlp and bitsandbytes_ms: once, at the first case)

        send(stdout, fuzz_cases.run(name, params))


if __name__ == "__main__":
    main()
