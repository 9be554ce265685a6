"""df.write / df.writeStream: checking the target, encoding rows, publishing with every PubAck awaited."""
