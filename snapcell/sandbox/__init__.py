"""Kernel confinement a worker applies to itself: resource limits, privileges, Landlock, seccomp, scratch."""
