"""What the library itself shows while it works: one progress line on stderr for long work."""
