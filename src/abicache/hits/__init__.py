"""Hit records: a fresh process's hit at the floor of loading the file by path.

A full lookup (core/) imports the store, computes the key (the compiler's identity), reads
the manifest, checks requirements, stamps and recorded dependencies: 25 ms of imports and a
few of work, where `ctypes.CDLL` of the same file takes one. After a full lookup found (or
made) the entry a frontend call asked for, writer.py writes a *hit record*: the file to
load and a witness of everything that lookup consulted (the store's folders and their
owners, the entry's files and stamp, every dependency, missing path and system file the
build recorded, the compiler that PATH finds and its identity's memo, the config files),
under a name that holds everything else it depended on (naming.py: the call, the working
directory, the store, the user and groups, the interpreter, the machine, the C library and
the whole environment). The next process making the same call reads the record, stats its
witnesses and loads the file (record.py): one file read, a stat a witness, no import of
the store, pathlib, re, json or typing. Any witness that moved, a deadline passed (the
entry's re-verification age, its next last-use touch), a record not of this user: the full
lookup runs, as if no record were there, and writes the record again.

A record is never looser than the lookup it stands for: what the lookup would decide from
something a record cannot witness (a fact beyond the name, several variants to rank, a
check sampled by ABICACHE_CHECK, a Cache given settings) is never recorded (writer.py).
Hits served so are counted as every hit is (tally.py).
"""
