"""`python -m aggbench.cli ...` (torchrun launches training this way)."""

from aggbench.cli import main

main()
