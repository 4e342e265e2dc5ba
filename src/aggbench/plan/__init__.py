"""`aggbench plan`: the cost of a grid before it is submitted (memory per GPU, GPU-hours, jobs)."""
