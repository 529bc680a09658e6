"""Layer 1, the foundations (internal): errors aside, what every other layer builds on: the
argument checker, dtype names, versions, the reversible patch helper, progress, provenance and
the readers and writers of user files. Nothing here imports a layer above."""
