"""Model files onto the disk: wheels and their chunks from PyPI, hub snapshots, GGUF conversion, the cache's bookkeeping. Depends on config."""
