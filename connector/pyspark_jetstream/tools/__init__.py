"""Tools around the connector (the embedded nats-server, the --py-files packer, the README tables); never imported by the data path."""
