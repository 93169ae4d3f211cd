"""The build engine, between the frontends (cc, torch, cuda) and the cache.

- depfile: the files a compiler read, from its Make-style dependency file;
- tree: where the sources live, the bases their dependencies are recorded
  against, and the location-free names and flags that go into keys;
- steer: what steers a build besides sources and flags ($CXX's words, the
  compiler's environment), for keys and in-process memos alike;
- observe: the observer preloaded into every compile and link (observe.c):
  files read, paths looked for and not found, variables read, programs run;
- record: what an entry records of that (and of the depfile);
- roots: folders whose contents the key already covers (the torch install's,
  the CUDA toolkit's, Python's; the compiler's own with system_headers sloppiness);
- units: each translation unit compiled in place, in parallel, as a cached
  object entry of its own, then linked;
- scratch: a build's private temporary folder, swept by a later build where its
  process was killed;
- pool: the job pool (MAX_JOBS, as torch spells it) and its progress lines;
- pch: precompiled headers kept as cached entries.
"""
