"""A worker process of the bad-input suite (started by tests/fuzz_pool.py): imports MindSpore, mindnlp and the
package once, then runs the cases it is sent (``(name, params)`` frames on stdin) and answers ``(kind, detail)``
frames on stdout. A crash here kills only this process; the pool records it and starts another."""

import faulthandler
import os
import sys
import warnings

faulthandler.enable()  # a native crash leaves its stack in the worker's log
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
warnings.simplefilter("ignore")

stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # anything the cases print goes to the log, not into the frame stream

import fuzz_cases  # noqa: E402  (imports MindSpore, mindnlp and bitsandbytes_ms)
from fuzz_pool import receive, send  # noqa: E402


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
        send(stdout, fuzz_cases.run(name, params))


if __name__ == "__main__":
    main()
