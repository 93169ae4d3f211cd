"""Native files read and loaded without a compiler: the ELF tables the audit and the probes read
(elftables), and a versioned GPU runtime library found and loaded (libload)."""
