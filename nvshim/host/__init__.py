"""Host discovery: NVML, driver files, device nodes and sysfs facts, as a typed model."""
