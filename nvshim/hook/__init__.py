"""nvshim-hook: the OCI hook (standalone prestart mode and the in-container finishing steps).

The step names it shares with the spec writers live in ``nvshim.hookentries``."""
