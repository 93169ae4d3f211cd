"""The cache: get_or_build (cache), the key (key), finding a variant that holds here (finding),
single flight across processes and machines, making and publishing an entry (making),
statistics and the size cap (counting), why a lookup missed (explain), where a miss builds
when the store is read-only (fallback), and what a builder returns (artifact)."""
