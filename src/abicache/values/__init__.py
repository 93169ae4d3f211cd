"""Small immutable values: versions, GPU targets, records, and the requirements an entry loads under
(their canonical lines and how they match facts). Imports nothing of abicache but errors."""
