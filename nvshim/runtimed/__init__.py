"""``nvshim-runtimed``: a resident process that does ``nvshim-runtime``'s Python work with
every module already imported, so a GPU create costs a few milliseconds and no
interpreter start (through a slot; through the client one start) instead of a start
plus ~16 ms of imports (``bench/engine_start.py``).

It listens on ``runtime.sock`` in the cache directory (mode 0600). Worker processes
forked from the warm parent accept the calls; for each, a worker takes on the client's
stdio, working directory and environment, runs ``nvshim.runtime.main.run`` with a ``LowLevel``
that hands the low-level runtime back to the client (exec, or spawn and report its
status), so runc stays the engine's grandchild, then puts its own back. The finishing
steps run in the worker. The parent keeps ``--workers`` alive, adds one whenever all
are busy (up to ``--max-workers``), retires extras idle for ``--idle-timeout``, and kills
a worker busy with one call for ``--call-timeout`` (its client fails the call and
deletes what it created).
Workers are recycled after ``RECYCLE`` calls and after any call that failed
unexpectedly. A worker serves calls one after another because a forked child would
pay copy-on-write faults for every page Python touches (~3 ms a call).

The sh front itself hands it a create or run that may ask for a GPU, through a slot
(``nvshim.runtime.slots``: a claim file and two FIFOs, no interpreter): the parent reads
the slot's request and hands the slot to an idle worker on its control pipe; the worker
takes the caller on from ``/proc`` and answers in lines, with the same code path.

A request is declined (the client does the call in-process, with its own privileges)
unless it comes from this user, with the capability sets, ``no_new_privs``, seccomp
mode and LSM label this process had at start, in its mount, pid and user namespaces
and root, from the same nvshim (version and files) with the same cache directory; and
when every worker is busy and no more may be added for ``QUEUE_WAIT`` seconds (a call
waits that long at most for others'). A served call runs with the caller's umask. The
daemon refuses to start on a cache directory another user could change
(``nvshim.runtimed.trust.check_cache_dir``).

At start and every ``--marker-sweep`` seconds the parent removes the exec markers whose
container is gone (``nvshim.runtime.markers.sweep``): while its slots are in place, the
front leaves the marker of each GPU container it deletes to this sweep.

Its modules: ``main`` (the command), ``server`` (listening, the parent's loop),
``pool`` (the parent's workers and slots in flight), ``worker`` (a call served in a
worker), ``trust`` (whom it serves). It imports ``nvshim.runtime``; nothing there
imports it but ``nvshim.runtime.daemon``, the old name kept for installed launchers.
"""

import os

TOOL = "nvshim-runtimed"


def say(fd: int, line: str) -> None:
    """One line on ``fd`` (the daemon's log), never failing a call."""
    try:
        os.write(fd, f"{TOOL}: {line}\n".encode(errors="replace"))
    except OSError:  # a log that cannot be written (full, closed) must not fail calls
        pass
