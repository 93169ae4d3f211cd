"""The build engine, between the frontends (cc, torch, cuda) and the cache.

- depfile: the files a compiler read, from its Make-style dependency file;
- tree: where the sources live, the bases their dependencies are recorded
  against, and the location-free names and flags that go into keys;
- roots: folders whose contents the key already covers (the compiler's own
  system headers, the torch install's, the CUDA toolkit's, Python's);
- units: each translation unit compiled in place, in parallel, as a cached
  object entry of its own, then linked;
- pool: the job pool (MAX_JOBS, as torch spells it) and its progress lines;
- pch: precompiled headers kept as cached entries.
"""
