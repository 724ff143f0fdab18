"""What the processes corellm spawns (tensor-parallel workers, data-parallel replicas) need from
the script that started them, and how their parent learns that one could not start.

Why: those processes are started with multiprocessing's "spawn" (a fork would copy the parent's
OpenMP thread team, which a child cannot use). A spawned process first imports the user's main
script again (as `__mp_main__`) to find the functions it runs. A script that builds its LLM at
top level, without `if __name__ == "__main__":`, would then build a second engine inside every
worker — load the model, run the whole script — before dying on multiprocessing's own error when
that engine tries to spawn, while the parent waited for the worker until the collective timeout
and then reported only that "1/3 clients joined". Instead:

  - refuse_while_importing_main(): LLM and AsyncLLM call it first; inside a spawned process that
    is still importing the main script it raises at once, naming the fix.
  - StartSignal: the parent gives each process it spawns the sending end of a pipe; the process
    sends once it has started its own work (its imports done); the parent waits for that or for
    the pipe to close (the process died), within a deadline, and then names the process, its
    exit status and the likely cause.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time

MAIN_GUARD_HINT = ('a script that creates an LLM must do it under `if __name__ == "__main__":` — corellm\'s '
                   "worker processes are spawned, and a spawned process imports the main script again")


def refuse_while_importing_main(what: str) -> None:
    """Raises RuntimeError when called while this process, spawned by multiprocessing, is still
    importing the parent's main script (multiprocessing marks that phase on the current process;
    its own check, made when such a process spawns, comes only after the engine was built)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was created while a spawned corellm process was importing the main script: "
                           f"{MAIN_GUARD_HINT}")


class StartSignal:
    """One spawned process's "I have started": the parent keeps the receiving end, the process
    gets `sender` (picklable to a spawned process) and calls StartSignal.send(sender)."""

    def __init__(self, context) -> None:
        self._receiver, self.sender = context.Pipe(duplex=False)
        self._process = None  # handed_to's

    def handed_to(self, process) -> None:
        """After process.start(): drop the parent's copy of the sending end, so that the process's
        end is the last one and its death closes the pipe."""
        self.sender.close()
        self.sender = None
        self._process = process

    @staticmethod
    def send(sender) -> None:
        """In the spawned process (sender None: not spawned with a signal). A parent that stopped
        listening is not this process's error."""
        if sender is None:
            return
        try:
            sender.send(True)
        except OSError:
            pass
        sender.close()

    def wait(self, deadline: float, what: str) -> None:
        """Returns once the process has sent; RuntimeError if it exited first, TimeoutError if it
        has done neither by `deadline` (time.monotonic())."""
        p = self._process
        remaining = max(0.0, deadline - time.monotonic())
        if not multiprocessing.connection.wait([self._receiver], timeout=remaining):
            raise TimeoutError(f"{what} {p.name} neither started nor exited in time")
        try:
            self._receiver.recv()
        except EOFError:
            p.join(timeout=5)
            raise RuntimeError(f"{what} {p.name} exited (status {p.exitcode}) before it started; its error is "
                               f"printed above (the usual cause: {MAIN_GUARD_HINT})") from None
        finally:
            self._receiver.close()
