"""Code that runs only inside a worker process or the zygote (``python -s -P -m snapcell.worker._worker``).

Nothing here runs in the host, and nothing here imports `snapcell.backends`: the two sides share `snapcell.wire`,
`snapcell.interpreter`, `snapcell.policy` and `snapcell.limits`.
"""
