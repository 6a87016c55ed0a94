"""l2_prefetch: start a linear's weight stream into L2 while the small kernels before it run."""
