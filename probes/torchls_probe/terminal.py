"""A pseudo-terminal on the run's stdin, so that code asking for the terminal works.

Why: scripts size their progress bars with `stty size` (which reads stdin) or
`os.get_terminal_size()` (which asks stdout); with stdin on /dev/null and stdout captured to a
file both fail, and such a script dies before its first step. In: `COLUMNS`/`LINES` from the
environment (the server sets them). Out: fd 0 is the slave side of a new pseudo-terminal of that
size, with echo off; its master is kept by this process (closing it would hang the terminal
up), pre-loaded with end-of-file characters so that `input()` ends instead of waiting for the
timeout, and drained by a daemon thread so that code writing to the terminal never blocks.
`os.get_terminal_size()` of a captured stream answers the terminal's size. Best effort: where no
pseudo-terminal can be opened, stdin stays as it was and `COLUMNS`/`LINES` remain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

DEFAULT_COLUMNS = 80
DEFAULT_LINES = 24
# How many reads of stdin end at once with end-of-file (each EOF character answers one read).
EOF_READS = 64


def _size() -> tuple[int, int]:
    def number(name: str, default: int) -> int:
        try:
            value = int(os.environ.get(name, ""))
        except ValueError:
            return default
        return value if 0 < value < 10000 else default

    return number("COLUMNS", DEFAULT_COLUMNS), number("LINES", DEFAULT_LINES)


def attach() -> bool:
    """Put a pseudo-terminal on fd 0; True when it worked."""
    try:
        import fcntl
        import struct
        import termios

        master, slave = os.openpty()
    except (ImportError, OSError):
        return False
    columns, lines = _size()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        attributes = termios.tcgetattr(slave)
        attributes[3] &= ~termios.ECHO  # nobody reads what would be echoed
        termios.tcsetattr(slave, termios.TCSANOW, attributes)
        os.dup2(slave, 0)
        os.write(master, b"\x04" * EOF_READS)
    except OSError:
        os.close(master)
        return False
    finally:
        os.close(slave)
    os.set_inheritable(master, False)
    threading.Thread(target=_drain, args=(master,), name="torchls-tty", daemon=True).start()
    _answer_size_for_captured_streams(columns, lines)
    return True


def _drain(master: int) -> None:
    # Signals are the user's main thread's business (a script may block SIGALRM there).
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        try:
            if not os.read(master, 65536):
                return
        except OSError:
            return


def _answer_size_for_captured_streams(columns: int, lines: int) -> None:
    """stdout and stderr go to the output file: asking their size answers the terminal's."""
    original = os.get_terminal_size

    def get_terminal_size(fd: int = 1) -> os.terminal_size:
        try:
            return original(fd)
        except OSError:
            if fd not in (1, 2):
                raise
            with contextlib.suppress(OSError):
                return original(0)
            return os.terminal_size((columns, lines))

    os.get_terminal_size = get_terminal_size
