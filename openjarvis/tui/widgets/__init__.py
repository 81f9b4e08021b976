"""The TUI's widgets, one concept per module."""
