"""Planning a write on the driver: options, the input layout, the target stream and the replay records' plan."""
