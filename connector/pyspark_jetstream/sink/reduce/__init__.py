"""The reduction of option ``sequenceBy``: each key's newest row, published under compare-and-set."""
