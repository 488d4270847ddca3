"""``nvshim node``: the node installer a privileged DaemonSet runs on every GPU node.

It installs nvshim on the host (through the host root mount), registers the runtime with
the node's engine, writes the CDI spec, runs the MPS daemons of a mounted sharing config,
reports ready, and on SIGTERM/SIGINT takes every change back. Everything it does goes
through the modules ``nvshim configure``, ``nvshim cdi generate`` and ``nvshim mps`` use.
"""
