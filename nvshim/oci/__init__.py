"""The OCI sink: container edits applied to a bundle's ``config.json``."""
