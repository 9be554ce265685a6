"""The publishing stage: a window of frames awaiting their PubAcks, and the recoveries that keep order."""
