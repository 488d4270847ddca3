"""CDI: the spec writer, name and version rules, validation and spec listing."""
