"""The orders example: runnel's README example, on streamkit."""
