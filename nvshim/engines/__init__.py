"""Register nvshim with container engines (containerd, Docker, CRI-O) and take it out again.

``configure``/``unconfigure`` in :mod:`nvshim.engines.apply` are the entry points; the
engine modules only say *what* to set, :mod:`nvshim.engines.common` does the safe writing
(lock, backup, atomic write, record of what was added) and the document modules
(:mod:`~nvshim.engines.tomldoc`, :mod:`~nvshim.engines.jsondoc`) keep every other byte.
"""

ENGINES = ("containerd", "docker", "crio")
