"""Talking to NATS: the I/O loop, connections, JetStream API requests, and the one module that touches nats-py's internals."""
