from __future__ import annotations


def write(df, server, **options):
    w = df.write.format("jetstream").mode("append").option("servers", server.url)
    for key, value in options.items():
        w = w.option(key.replace("__", "."), value)
    w.save()
