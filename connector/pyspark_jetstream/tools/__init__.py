"""Tools around the connector (the embedded nats-server, the --py-files packer, the option tables in docs/); never imported by the data path."""
