"""nvshim-hook: the OCI hook (standalone prestart mode and the in-container finishing steps)."""
