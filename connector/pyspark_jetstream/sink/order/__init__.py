"""The order stage: each subject's rows published in source order, or counted where that order arrived broken."""
