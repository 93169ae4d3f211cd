"""abicache as a compiler launcher (issue 50, begun): what a compiler command line asks
for (`command.py`).

The plan, from bench/launcher_floor.py's numbers (docs/benchmarks.md): a launcher written in
Python starts at 1.7x ccache's whole hit, so hits will be served by a small native front
reading hit records by stat (as hits/record.py does), and misses handed to Python, which
compiles through the engine's observer and writes the record.
"""
