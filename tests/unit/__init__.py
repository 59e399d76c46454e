"""In-process tests: berth's parts, in-memory drivers, the embedded cluster, the API over ASGI."""
