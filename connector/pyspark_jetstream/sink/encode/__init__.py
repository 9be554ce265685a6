"""The encoding stage: rows checked and turned into ``HPUB`` frames with deterministic message ids."""
