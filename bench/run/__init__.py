"""`python -m bench run` (and `headline`): the benchmark itself. `experiments` measures baseline, RelayGR
and its ablations side by side, in the phases `phases` times the host's unit around; `gpu` is the gpu
profile's; `record` assembles what a run measured into its results; `__main__` runs and writes them."""
