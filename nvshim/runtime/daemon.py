"""Moved: nvshim-runtimed is ``nvshim.runtimed`` (its command: ``nvshim.runtimed.main``).

Kept for one upgrade only: a launcher written by an older ``nvshim install`` straight
into a bin directory (no bundle: ``install --bin-dir``, or ``--prefix`` without one)
runs ``from nvshim.runtime.daemon import main``. When the Python package is upgraded
before ``nvshim install`` rewrites that launcher, a restart of nvshim-runtimed.service
in between would otherwise fail to start (a bundle install replaces its launchers and
its modules together and never needs this). Nothing in nvshim imports it; the import
contract (``.ci/imports.py``) names it as its one exception.
"""

from nvshim.runtimed.main import main

__all__ = ["main"]
